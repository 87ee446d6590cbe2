"""History compaction: stale tool outputs collapse to their facts, stably, and the prompt shrinks."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agent_gravity import ChatGravity, InvalidCallOptionError, KVConfig
from agent_gravity._compaction import collapse_tool_output, compact_history

LOG = "\n".join(f"[INFO] worker-{i} heartbeat ok latency={i % 7}ms" for i in range(20)) + "\n[WARN] code is K7Q2X9"


def test_repeated_lines_go_and_rare_facts_stay_word_for_word():
    assert collapse_tool_output(LOG) == "[WARN] code is K7Q2X9\n[20 repeated log lines omitted]"
    assert collapse_tool_output("just one line") == "just one line"
    assert collapse_tool_output(collapse_tool_output(LOG)) == collapse_tool_output(LOG), "stable in later turns"


def test_only_stale_tool_outputs_are_collapsed():
    chat = [{"role": "user", "content": "go"}, {"role": "tool", "content": LOG},
            {"role": "assistant", "content": "ok"}, {"role": "tool", "content": LOG}]
    out = compact_history(chat, keep_recent=1)
    assert out[1]["content"].startswith("[WARN] code is K7Q2X9") and out[3]["content"] == LOG
    assert compact_history(chat, keep_recent=0)[3]["content"] == out[1]["content"]
    assert chat[1]["content"] == LOG, "the caller's messages are not changed"


def test_compaction_shrinks_the_prompt_on_the_vllm_backend(chat, spans):
    history = [HumanMessage("Check it."),
               AIMessage("", tool_calls=[{"name": "logs", "args": {}, "id": "a", "type": "tool_call"}]),
               ToolMessage(LOG, tool_call_id="a"), AIMessage("Done."), HumanMessage("What was the code?")]
    plain = chat.invoke(history, max_tokens=4)
    compact = ChatGravity(backend=chat.get_backend(), kv=KVConfig(trim=False, compact_tool_outputs=0))
    small = compact.invoke(history, max_tokens=4)
    assert small.usage_metadata["input_tokens"] < plain.usage_metadata["input_tokens"] - 200
    # The blocks vLLM's own cache manager held for each call: at least the prompt's, and fewer once compacted.
    blocks = [m.response_metadata["gravity"]["kv_blocks"] for m in (plain, small)]
    for message, b in zip((plain, small), blocks):
        assert b["blocks"] * b["block_size"] >= message.usage_metadata["input_tokens"]
        assert 0 <= b["engine_blocks_used"] < b["engine_blocks_total"]
    assert blocks[1]["blocks"] < blocks[0]["blocks"]
    # What stays is reused: the compacted history again comes from vLLM's prefix cache, whole blocks of it.
    again = compact.invoke(history, max_tokens=4).response_metadata["gravity"]["kv_blocks"]
    assert again["cached_tokens"] >= again["block_size"] and again["cached_tokens"] % again["block_size"] == 0
    last = [s for s in spans.get_finished_spans() if s.name.startswith("chat ")][-1].attributes
    assert (last["agent_gravity.kv.blocks"], last["agent_gravity.kv.cached_tokens"]) == (again["blocks"],
                                                                                         again["cached_tokens"])
    with pytest.raises(InvalidCallOptionError, match="KVConfig.trim=False"):
        ChatGravity(backend=chat.get_backend(), kv=KVConfig()).invoke("hi")
