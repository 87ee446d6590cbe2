"""Tool-calling wire format: schemas, tool choice, the fallback format, grammars and parsing."""

from __future__ import annotations

import json

import pytest
from langchain_core.tools import tool

from agent_gravity._errors import InvalidCallOptionError, ToolSchemaError
from agent_gravity._tools import (
    ToolSet,
    ToolStreamSplitter,
    auto_grammar,
    convert_tools,
    forced_grammar,
    format_call,
    parse_output,
    tool_choice,
    with_tools,
)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def weather(location: str) -> str:
    """Weather at a location."""
    return "sunny"


TOOLS = convert_tools([add, weather])


def test_tools_convert_to_function_schemas_without_touching_the_callers_dicts():
    assert [t["function"]["name"] for t in TOOLS] == ["add", "weather"]
    mine = {"type": "function", "function": {"name": "f", "description": "f"}}
    assert convert_tools([mine])[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert "parameters" not in mine["function"]
    assert TOOLS[0]["function"]["parameters"]["required"] == ["a", "b"]


ARRAY_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}


@pytest.mark.parametrize("bad", [object(), ARRAY_TOOL, {"type": "web_search"}])
def test_a_tool_that_cannot_be_rendered_is_a_clear_error(bad):
    with pytest.raises(ToolSchemaError, match="tool"):
        convert_tools([bad])


def test_two_schemas_under_one_name_both_hold():
    both = ToolSet(convert_tools([add, {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]), "add")
    assert len(both.offered) == 2 and len(forced_grammar(both.offered)["anyOf"]) == 2
    assert parse_output('{"name": "add", "arguments": {"x": 1}}', both).tool_calls[0]["args"] == {"x": 1}


@pytest.mark.parametrize(("given", "want"), [(None, "auto"), ("auto", "auto"), ("any", "required"), (True, "required"),
                                             ({"type": "any"}, "required"), ({"type": "tool", "name": "add"}, "add"),
                                             ("required", "required"), ("none", "none"), ("add", "add"),
                                             ({"type": "function", "function": {"name": "weather"}}, "weather")])
def test_tool_choice_forms(given, want):
    assert tool_choice(given, ["add", "weather"]) == want


@pytest.mark.parametrize("bad", ["subtract", 3, {"type": "function", "function": {"name": "nope"}}])
def test_unknown_tool_choice_names_the_choices(bad):
    with pytest.raises(InvalidCallOptionError, match="unknown tool_choice.*add, weather"):
        tool_choice(bad, ["add", "weather"])


def test_tool_set_offers_what_the_choice_allows():
    assert ToolSet(TOOLS, "auto").offered == TOOLS and not ToolSet(TOOLS, "auto").forced
    assert ToolSet(TOOLS, "weather").offered == (TOOLS[1],) and ToolSet(TOOLS, "weather").forced
    assert ToolSet(TOOLS, "none").offered == ()


def test_history_renders_calls_as_text_and_offers_tools_in_the_system_message():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"},
            {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "args": {"a": 1, "b": 2}}]},
            {"role": "tool", "content": "3"}]
    out = with_tools(chat, TOOLS)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.")
    assert '"name": "add"' in out[0]["content"]
    assert out[2]["content"] == format_call("add", {"a": 1, "b": 2})
    assert with_tools(chat, ())[0] == {"role": "system", "content": "Be brief."}


def test_grammars_hold_each_call_to_its_tool():
    assert forced_grammar(TOOLS[:1])["properties"]["name"] == {"const": "add"}
    assert len(forced_grammar(TOOLS)["anyOf"]) == 2
    tag = json.loads(auto_grammar(TOOLS))
    assert tag["triggers"] == ["<tool_call>"]
    assert tag["structures"][1]["begin"].endswith('"name": "weather", "arguments": ')


def test_parse_reads_calls_text_and_bad_calls():
    text = ('Let me add.\n' + format_call("add", {"a": 1, "b": 2}) + "\n<tool_call>\n{\"name\": \"add\", \"arg")
    parsed = parse_output(text, ToolSet(TOOLS, "auto"))
    assert parsed.content == "Let me add."
    assert [(c["name"], c["args"]) for c in parsed.tool_calls] == [("add", {"a": 1, "b": 2})]
    assert len(parsed.invalid_tool_calls) == 1 and "not valid JSON" in parsed.invalid_tool_calls[0]["error"]
    forced = parse_output('{"name": "weather", "arguments": {"location": "Oslo"}}', ToolSet(TOOLS, "required"))
    assert forced.tool_calls[0]["args"] == {"location": "Oslo"} and forced.content == ""
    unknown = parse_output('<tool_call>{"name": "fly", "arguments": {}}</tool_call>', ToolSet(TOOLS, "auto"))
    assert unknown.invalid_tool_calls[0]["name"] == "fly" and not unknown.tool_calls


def test_streaming_releases_text_and_holds_calls_back():
    splitter = ToolStreamSplitter(ToolSet(TOOLS, "auto"))
    pieces = ["Sure", ", adding.\n<tool", '_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>']
    released = "".join(splitter.feed(p) for p in pieces)
    rest, parsed = splitter.close()
    assert released == "Sure, adding." and rest == ""
    assert parsed.tool_calls[0]["args"] == {"a": 1, "b": 2}


@pytest.mark.parametrize("text", ["  Hello there.\n" + format_call("add", {"a": 1, "b": 2}) + "\n\nAfter text ",
                                  "Just text, no call.  ", "   ", format_call("add", {"a": 1, "b": 2}),
                                  "Tail <tool", "a < b and <tool_call>\n{\"name\": \"add\""])
def test_streamed_content_adds_up_to_what_invoke_gives(text):
    tools = ToolSet(TOOLS, "auto")
    splitter = ToolStreamSplitter(tools)
    released = "".join(splitter.feed(text[i:i + 3]) for i in range(0, len(text), 3))
    rest, parsed = splitter.close()
    assert released + rest == parse_output(text, tools).content == parsed.content


def test_a_streamed_call_that_does_not_parse_stays_invalid_once_chunks_are_joined():
    from langchain_core.messages import AIMessageChunk, ToolCallChunk

    for body in ('{"name": "fly", "arguments": {}}', '{"name": "add", "arguments": {"a": 1'):
        bad = parse_output(f"<tool_call>{body}", ToolSet(TOOLS, "auto")).invalid_tool_calls[0]
        chunk = AIMessageChunk(content="", tool_call_chunks=[ToolCallChunk(
            name=bad["name"], args=json.dumps(bad["args"]), id=bad["id"], index=0, type="tool_call_chunk")])
        joined = AIMessageChunk(content="") + chunk
        assert joined.tool_calls == [] and len(joined.invalid_tool_calls) == 1
