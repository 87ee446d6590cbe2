"""Session KV caches on the transformers backend: reused across turns, never stale, really freed."""

from __future__ import annotations

import pytest
from agent_gravity.backends._sessions import SessionStore
from agent_gravity.backends.local_transformers import common_prefix
from langchain_core.messages import AIMessage, HumanMessage

from agent_gravity import ChatGravity, GravityConfig, SessionNotFoundError

OFF = GravityConfig(enabled=False)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0 == common_prefix([2], [1])


def test_a_second_turn_reuses_the_first_turns_cache_and_answers_as_a_fresh_call_would(transformers_backend):
    chat = ChatGravity(backend=transformers_backend, gravity=OFF, max_tokens=24)
    first = [HumanMessage("Tom has 3 apples and buys 5 more. How many apples does he have?")]
    one = chat.invoke(first, conversation_id="turns")
    s1 = one.response_metadata["gravity"]["session"]
    assert s1["reused_tokens"] == 0 and s1["kv_bytes"] > 0
    assert s1["prefilled_tokens"] == one.usage_metadata["input_tokens"]
    second = [*first, AIMessage(one.content), HumanMessage("And if he eats two?")]
    two = chat.invoke(second, conversation_id="turns")
    s2 = two.response_metadata["gravity"]["session"]
    # Everything up to the first turn's reply is reused; the reply itself is rendered anew (no reasoning).
    assert s1["prefilled_tokens"] - 8 <= s2["reused_tokens"] < s1["prefilled_tokens"] and s2["reset"] is None
    assert s2["reused_tokens"] + s2["prefilled_tokens"] == two.usage_metadata["input_tokens"]
    assert s2["kv_bytes"] > s1["kv_bytes"]
    fresh = chat.invoke(second)
    assert fresh.content == two.content and fresh.response_metadata["gravity"]["session"] is None


def test_a_changed_history_keeps_only_the_shared_prefix(transformers_backend):
    chat = ChatGravity(backend=transformers_backend, gravity=OFF, max_tokens=12)
    chat.invoke("Name a colour.", conversation_id="changed")
    other = chat.invoke("Name an animal.", conversation_id="changed")
    report = other.response_metadata["gravity"]["session"]
    assert 0 < report["reused_tokens"] < other.usage_metadata["input_tokens"]
    assert other.content == chat.invoke("Name an animal.").content


def test_sessions_end_and_unknown_ones_are_a_clear_error(transformers_backend):
    ChatGravity(backend=transformers_backend, gravity=OFF, max_tokens=4).invoke("Hi", conversation_id="gone")
    transformers_backend.end_session("gone")
    assert "gone" not in transformers_backend.sessions
    with pytest.raises(SessionNotFoundError, match="no KV session 'gone'"):
        transformers_backend.end_session("gone")


def test_a_chat_model_with_kv_config_trims_each_conversation_as_it_grows(transformers_backend):
    from agent_gravity import KVConfig

    chat = ChatGravity(backend=transformers_backend, gravity=OFF, max_tokens=6,
                       kv=KVConfig(policy={"name": "snapkv"}, ratio=4, trim_above=64, quantize_below=None))
    long = HumanMessage("Log:\n" + "\n".join(f"line {i}: all fine" for i in range(40)) + "\nSummarise the log.")
    first = chat.invoke([long], conversation_id="kv-config").response_metadata["gravity"]["session"]
    trim = first["trim"]
    assert trim["policy"] == "snapkv" and trim["bytes_after"] < trim["bytes_before"] / 2
    second = chat.invoke([long, AIMessage("Fine."), HumanMessage("Anything odd?")], conversation_id="kv-config")
    report = second.response_metadata["gravity"]["session"]
    assert report["reset"] is None and report["reused_tokens"] > 100 and report["trim"] is None  # below trim_above


def test_kv_config_is_checked_and_refused_where_it_cannot_work(chat):
    from agent_gravity import InvalidCallOptionError, KVConfig

    with pytest.raises(ValueError, match="unknown trim policy 'lru'"):
        KVConfig(policy={"name": "lru"})
    with pytest.raises(ValueError, match="ratio"):
        KVConfig(ratio=0.5)
    with pytest.raises(InvalidCallOptionError, match="kv trimming needs a backend with session KV caches"):
        ChatGravity(backend=chat.get_backend(), kv=KVConfig()).invoke("hi")


def test_a_finished_turns_reasoning_is_freed_and_never_read_back(transformers_backend):
    chat = ChatGravity(backend=transformers_backend, gravity=GravityConfig(max_reasoning_tokens=48))
    question = [HumanMessage("Tom has 3 apples and buys 5 more. How many apples does he have?")]
    reply = chat.invoke(question, conversation_id="reasoning")
    gravity = reply.response_metadata["gravity"]
    session = transformers_backend.sessions["reasoning"]
    prompt = reply.usage_metadata["input_tokens"]
    held = {p for head in session.cache.heads[0] for p in head.positions.tolist()}
    assert gravity["reasoning_tokens"] > 0 and session.intact_until == prompt
    assert not held & set(range(prompt, prompt + gravity["reasoning_tokens"]))
    assert set(range(prompt)) <= held
    follow = chat.invoke([*question, reply, HumanMessage("And then he eats one?")], conversation_id="reasoning")
    report = follow.response_metadata["gravity"]["session"]
    assert report["reset"] is None and 0 < report["reused_tokens"] <= prompt


def test_the_ragged_cache_gives_exactly_transformers_own_logits(transformers_backend):
    import torch
    from transformers import DynamicCache

    ids = transformers_backend.encode("The capital of France is Paris. The capital of Italy is")
    model, ragged = transformers_backend._model, transformers_backend.new_cache()
    dynamic = DynamicCache(config=model.config)
    with torch.no_grad():
        for step in (ids, [ids[-1]], [ids[-2]]):
            ours = transformers_backend.forward(step, ragged)
            theirs = model(torch.tensor([step]), past_key_values=dynamic, use_cache=True).logits[0, -1].float()
            assert torch.equal(ours, theirs)


def test_sessions_past_the_cap_are_evicted_least_recently_used_and_a_returning_one_hears_why(
        transformers_backend, monkeypatch):
    monkeypatch.setattr(transformers_backend, "sessions", SessionStore(max_sessions=2, max_bytes=2**40))
    chat = ChatGravity(backend=transformers_backend, gravity=OFF, max_tokens=4)
    for name in ("a", "b", "a", "c"):  # "a" was used again after "b", so "b" is the least recently used
        chat.invoke("Name a colour.", conversation_id=name)
    assert sorted(transformers_backend.sessions) == ["a", "c"]
    back = chat.invoke("Name a colour.", conversation_id="b").response_metadata["gravity"]["session"]
    assert back["reused_tokens"] == 0 and "evicted" in back["reset"] and "max_sessions=2" in back["reset"]
    with pytest.raises(SessionNotFoundError, match="evicted"):
        transformers_backend.end_session("a")  # "b" came back, so "a" went next
