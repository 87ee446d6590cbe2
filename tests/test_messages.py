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
