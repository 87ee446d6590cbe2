"""The wire format alone: OpenAI requests to LangChain messages and ChatGravity options, messages to replies."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage

from agent_gravity import GravityConfig
from agent_gravity.serve._wire import (
    CLIENT_SETTINGS,
    ChatCompletionRequest,
    WireError,
    call_options,
    checked_client_settings,
    chunks,
    client_gravity,
    completion,
    to_message,
)

WIRE = {"id": "chatcmpl-1", "created": 1, "model": "m"}


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_every_role_becomes_its_langchain_message_with_calls_and_ids():
    messages = request(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
        {"role": "user", "content": "Weather in Paris?", "name": "ann"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]).messages
    system, user, assistant, tool = (to_message(m) for m in messages)
    assert isinstance(system, SystemMessage) and system.content == "Be brief."
    assert isinstance(user, HumanMessage) and user.content == "Weather in Paris?"
    assert assistant.tool_calls == [{"name": "weather", "args": {"city": "Paris"}, "id": "call_1",
                                     "type": "tool_call"}]
    assert isinstance(tool, ToolMessage) and tool.tool_call_id == "call_1"


def test_call_arguments_that_are_not_a_json_object_are_refused_where_they_are():
    with pytest.raises(ValueError, match="arguments must be a JSON object"):
        request(messages=[{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}])


def test_options_map_to_chatgravity_and_never_name_a_model():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    options = call_options(request(model="other", temperature=0.5, max_completion_tokens=9, task="legal",
                                   tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}}),
                           GravityConfig())
    assert options == {"temperature": 0.5, "max_tokens": 9, "task": "legal", "tools": [tool],
                       "tool_choice": {"type": "function", "function": {"name": "f"}}}
    assert call_options(request(response_format={"type": "json_object"}), GravityConfig()) == {
        "response_format": {"type": "object"}}
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    held = request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert call_options(held, GravityConfig())["response_format"] == schema


def test_a_gravity_patch_keeps_the_servers_other_fields_and_names_a_bad_one():
    server = GravityConfig(min_tokens=4, max_reasoning_tokens=64)
    merged = call_options(request(gravity={"max_reasoning_tokens": 8}), server)["gravity"]
    assert (merged.min_tokens, merged.max_reasoning_tokens) == (4, 8)  # 8 alone would clash with the default 16
    with pytest.raises(WireError, match="min_tokens .* must be below") as caught:
        call_options(request(gravity={"max_reasoning_tokens": 2}), server)
    assert caught.value.param == "gravity"


def test_a_completion_carries_usage_reasoning_tokens_gravity_and_invalid_calls_raw():
    message = AIMessage(
        "", tool_calls=[{"name": "f", "args": {"a": 1}, "id": "c1"}],
        invalid_tool_calls=[{"name": None, "args": "{oops", "id": "c2", "error": "bad", "type": "invalid_tool_call"}],
        usage_metadata={"input_tokens": 3, "output_tokens": 5, "total_tokens": 8,
                        "output_token_details": {"reasoning": 2}},
        response_metadata={"finish_reason": "stop", "gravity": {
            "enabled": True, "terminated_early": True, "reasoning_tokens": 2, "answer_tokens": 3,
            "answer_complete": True, "entropy": [0.1, float("nan")], "probes": 1}})
    body = json.loads(completion(message, **WIRE).model_dump_json())
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == ['{"a": 1}', "{oops"]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    assert body["gravity"]["entropy"] == [0.1, None] and body["gravity"]["probes"] == 1  # JSON has no NaN


def test_the_last_stream_chunk_finishes_with_gravity_then_usage():
    gravity = {"enabled": False, "terminated_early": False, "reasoning_tokens": 0, "answer_tokens": 1,
               "answer_complete": False, "entropy": [0.3]}
    last = AIMessageChunk("!", chunk_position="last", usage_metadata={
        "input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        response_metadata={"finish_reason": "length", "gravity": gravity})
    finishing, usage = chunks(last, **WIRE, include_usage=True)
    assert finishing.choices[0].finish_reason == "length" and finishing.gravity.entropy == [0.3]
    assert usage.choices == [] and usage.usage.total_tokens == 2
    assert chunks(AIMessageChunk(""), **WIRE, include_usage=True) == []


def test_clients_may_change_only_the_allowed_settings_and_only_lower_the_budgets():
    server = GravityConfig(min_tokens=4, max_reasoning_tokens=64, max_answer_tokens=32)
    lowered = client_gravity(server, {"enabled": False, "max_reasoning_tokens": 8, "max_answer_tokens": 32},
                             CLIENT_SETTINGS)
    assert (lowered.enabled, lowered.max_reasoning_tokens, lowered.max_answer_tokens) == (False, 8, 32)
    for patch, param, says in [
        ({"max_answer_tokens": 33}, "gravity.max_answer_tokens", "may not exceed this server's 32"),
        ({"max_reasoning_tokens": "65"}, "gravity.max_reasoning_tokens", "may not exceed"),  # validated, compared
        ({"min_tokens": 1}, "gravity.min_tokens", "its operator can allow more"),
        ({"polcy": {}}, "gravity.polcy", "not a setting clients may change"),
    ]:
        with pytest.raises(WireError, match=says) as refused:
            client_gravity(server, patch, CLIENT_SETTINGS)
        assert refused.value.param == param
    assert client_gravity(server, {"loop": None}, frozenset({"loop"})).loop is None
    with pytest.raises(WireError, match="send only no gravity settings"):
        client_gravity(server, {"enabled": True}, frozenset())


def test_the_allowlist_names_gravity_config_fields_only():
    assert checked_client_settings(["enabled", "policy"]) == {"enabled", "policy"}
    with pytest.raises(ValueError, match=r"\['budget'\] are not GravityConfig fields"):
        checked_client_settings(["enabled", "budget"])
