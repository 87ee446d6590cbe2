import pytest
from langchain_core.messages import AIMessage, ChatMessage, FunctionMessage, HumanMessage, SystemMessage

from agent_gravity._messages import to_chat_dicts


def test_converts_roles_and_text_blocks():
    got = to_chat_dicts([
        SystemMessage("sys"),
        HumanMessage(content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
        AIMessage(content=[{"type": "reasoning", "reasoning": "hidden"}, {"type": "text", "text": "ans"}]),
        ChatMessage(role="tool", content="42"),
    ])
    assert got == [{"role": "system", "content": "sys"}, {"role": "user", "content": "ab"},
                   {"role": "assistant", "content": "ans"}, {"role": "tool", "content": "42"}]


def test_empty_list_is_a_clear_error():
    with pytest.raises(ValueError, match="message list is empty"):
        to_chat_dicts([])


def test_unknown_role_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown message role 'narrator'"):
        to_chat_dicts([ChatMessage(role="narrator", content="x")])
    with pytest.raises(ValueError, match="unsupported message type FunctionMessage"):
        to_chat_dicts([FunctionMessage(name="f", content="x")])


def test_non_text_content_is_refused_not_dropped():
    with pytest.raises(ValueError, match="'image_url' are not supported"):
        to_chat_dicts([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])])


def _result(steering, tokens, finish="stop"):
    from agent_gravity.backends.base import GenerationResult

    return GenerationResult("r", tokens, "text", finish, 5, entropy=list(steering.entropy[:len(tokens)]),
                            steering=steering)


def test_gravity_metadata_reports_probes_and_a_stopped_loop():
    from agent_gravity._messages import gravity_metadata
    from agent_gravity._steering import Steering, SteeringSpec

    loop = {"name": "loop", "repeats": 3, "max_period": 4, "min_span": 6, "threshold": 0.5}
    steering = Steering(SteeringSpec(key="k", eos_ids=(2,), loop=loop))
    out: list[int] = []
    for i in range(20):
        action = steering.step(0.1, out)
        out.append(action.force if action.force is not None else 7 + i % 2)
    g = gravity_metadata(_result(steering, out), budget=64)
    assert g["enabled"] and g["terminated_early"] and g["reason"] == "loop"
    assert g["loop_stop"]["step"] == g["lock_step"] and g["loop_stop"]["policy"] == "loop"
    assert g["tokens_saved_upper_bound"] == 64 - len(out), "a stopped loop saves the budget it had left"
    assert g["detail"].startswith("loop locked at token") and g["trigger"]["period"] == 2
    assert not g["answer_complete"], "a cut loop is not a finished answer"
    assert g["probes"] == 0 and g["probe_tokens"] == 0
