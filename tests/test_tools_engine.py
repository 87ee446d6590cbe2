"""Tool calling on the real engine: grammar-held calls, streaming chunks and bad input."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool

from agent_gravity import ChatGravity, InvalidCallOptionError, SchemaNotEnforceableError, ToolSchemaError


@tool
def magic_function(input: int) -> int:
    """Applies a magic function to an input."""
    return input + 2


@tool
def get_weather(location: str) -> str:
    """Get the weather at a location."""
    return "It's sunny."


QUESTION = "What is the value of magic_function(3)? Use the tool."


def test_a_forced_call_is_held_to_its_schema_and_parsed_into_tool_calls(chat):
    for choice in ("any", "magic_function", {"type": "function", "function": {"name": "magic_function"}}):
        reply = chat.bind_tools([magic_function, get_weather], tool_choice=choice).invoke(QUESTION)
        call, = reply.tool_calls
        assert call["name"] == "magic_function" and isinstance(call["args"]["input"], int) and call["id"]
        assert reply.content == "" and reply.usage_metadata["output_tokens"] > 0
        gravity = reply.response_metadata["gravity"]
        assert not gravity["terminated_early"] and not gravity["enabled"] and gravity["entropy"]


def test_tools_can_be_passed_per_call(chat):
    reply = chat.invoke("Weather in Oslo?", tools=[get_weather], tool_choice="any")
    assert reply.tool_calls[0]["name"] == "get_weather"


def test_a_streamed_call_arrives_as_tool_call_chunks_with_usage(chat):
    chunks = list(chat.bind_tools([get_weather], tool_choice="get_weather").stream("Weather in Paris?"))
    last = chunks[-1]
    assert last.chunk_position == "last" and last.tool_call_chunks and last.usage_metadata["output_tokens"] > 0
    full = sum(chunks[1:], chunks[0])
    assert full.tool_calls[0]["name"] == "get_weather" and isinstance(full.tool_calls[0]["args"]["location"], str)


def test_auto_choice_lets_the_model_answer_in_text(chat):
    reply = chat.bind_tools([get_weather]).invoke("Say hello.")
    assert "hello" in reply.content.lower() and not reply.tool_calls and not reply.invalid_tool_calls
    assert reply.response_metadata["gravity"]["answer_complete"]


def test_tool_histories_render_in_order_and_the_reply_is_whole(chat):
    history = [HumanMessage("What is magic_function(3)?"),
               AIMessage([{"type": "text", "text": "Calling."},
                          {"type": "tool_use", "id": "abc", "name": "magic_function", "input": {"input": 3}}],
                         tool_calls=[{"name": "magic_function", "args": {"input": 3}, "id": "abc",
                                      "type": "tool_call"}]),
               ToolMessage("magic_function(3) = 5", tool_call_id="abc", name="magic_function")]
    call = chat._prepare(history, None, {"tools": [magic_function]})
    prompt = chat.get_backend().decode(call.request.prompt_ids)
    question, text, args, result = (prompt.find(s) for s in (
        "What is magic_function(3)?", "Calling.", '"input": 3', "magic_function(3) = 5"))
    assert -1 < question < text < args < result, prompt  # the call's text and arguments, then the tool's result
    reply = chat.bind_tools([magic_function]).invoke(history)
    assert reply.response_metadata["gravity"]["answer_complete"] and (reply.content.strip() or reply.tool_calls)


def test_a_call_cut_by_the_budget_surfaces_as_an_invalid_tool_call(chat):
    reply = chat.bind_tools([get_weather], tool_choice="any").invoke("Weather in Paris?", max_tokens=4)
    assert reply.tool_calls == [] and len(reply.invalid_tool_calls) == 1
    assert "not valid JSON" in reply.invalid_tool_calls[0]["error"]


def test_bad_tool_input_gets_clear_errors(chat):
    with pytest.raises(InvalidCallOptionError, match="unknown tool_choice 'fly'"):
        chat.bind_tools([get_weather], tool_choice="fly")
    with pytest.raises(ToolSchemaError, match="cannot render tool"):
        chat.bind_tools([42])
    with pytest.raises(InvalidCallOptionError, match="without tools"):
        chat.invoke("hi", tool_choice="any")
    lookbehind = {"type": "function", "function": {"name": "f", "description": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}, "required": ["x"]}}}
    with pytest.raises(SchemaNotEnforceableError, match="cannot enforce this schema.*Lookbehind"):
        chat.bind_tools([lookbehind], tool_choice="any").invoke("hi")
    schema = {"title": "T", "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}
    with pytest.raises(SchemaNotEnforceableError):
        chat.with_structured_output(schema).invoke("hi")


def test_the_embedded_model_answers_to_its_name_per_call(chat):
    reply = ChatGravity().invoke("Hello", model="SmolLM2-135M-Instruct", max_tokens=8)
    assert reply.response_metadata["model_name"] == "SmolLM2-135M-Instruct"
