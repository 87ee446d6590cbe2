"""Wire format of tool calling: tool schemas, tool choice, the Hermes ``<tool_call>`` text format and its grammar.

The embedded model's chat template has no tool support, so tools travel in the documented
fallback format that Hermes-style templates (Qwen, Hermes, SmolLM3) also use: the tool list
goes into the system message as JSON, a call is written as::

    <tool_call>
    {"name": "get_weather", "arguments": {"location": "Paris"}}
    </tool_call>

and a tool's result comes back as a ``tool`` message. The engine's grammar holds every call to
its tool's argument schema. Pure functions only.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import InvalidToolCall, ToolCall
from langchain_core.utils.function_calling import convert_to_openai_tool

from agent_gravity._errors import InvalidCallOptionError, ToolSchemaError
from agent_gravity._reasoning import marker_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)
_AUTO, _REQUIRED, _NONE = "auto", "required", "none"


@dataclass(frozen=True)
class ToolSet:
    """The tools of one call and how the model must use them."""

    tools: tuple[dict[str, Any], ...]
    """OpenAI-format function tools: ``{"type": "function", "function": {name, description, parameters}}``."""
    choice: str
    """``auto`` (the model decides), ``required`` (it must call one), ``none``, or one tool's name."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t["function"]["name"] for t in self.tools)

    @property
    def offered(self) -> tuple[dict[str, Any], ...]:
        """The tools the model may call in this call."""
        if self.choice == _NONE:
            return ()
        if self.choice in (_AUTO, _REQUIRED):
            return self.tools
        return tuple(t for t in self.tools if t["function"]["name"] == self.choice)

    @property
    def forced(self) -> bool:
        """The output must be one tool call and nothing else."""
        return self.choice not in (_AUTO, _NONE)


def convert_tools(tools: Sequence[Any]) -> tuple[dict[str, Any], ...]:
    """OpenAI function-tool dicts of LangChain tools, pydantic models, functions or tool dicts."""
    out = []
    for tool in tools:
        try:
            converted = copy.deepcopy(convert_to_openai_tool(tool))  # it may hand back the caller's own dict
        except Exception as exc:  # noqa: BLE001 - langchain-core raises many kinds for a bad schema
            raise ToolSchemaError(f"cannot render tool {tool!r} as a JSON schema ({exc}); pass a BaseTool, a "
                                  "function with type hints and a docstring, a pydantic model or an OpenAI tool dict"
                                  ) from exc
        fn = converted.get("function") if converted.get("type") == "function" else None
        if not fn or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ToolSchemaError(f"tool {tool!r} is not a function tool with a name; only function tools can be "
                                  "called by this model")
        params = fn.setdefault("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ToolSchemaError(f"tool {fn['name']!r} takes {params!r}; its parameters must be a JSON schema "
                                  "object (``{'type': 'object', 'properties': ...}``)")
        try:
            json.dumps(params)
        except (TypeError, ValueError) as exc:
            raise ToolSchemaError(f"tool {fn['name']!r} has parameters that are not JSON ({exc})") from exc
        out.append(converted)
    # Two schemas under one name (a pydantic model and its JSON schema, say) both stay: a call may match either.
    return tuple(out)


def tool_choice(choice: Any, names: Sequence[str]) -> str:
    """Normalise LangChain's ``tool_choice`` forms to ``auto``, ``required``, ``none`` or a tool name."""
    if choice is None or choice == _AUTO:
        return _AUTO
    if choice is True or choice in ("any", _REQUIRED):
        return _REQUIRED
    if choice is False or choice == _NONE:
        return _NONE
    if isinstance(choice, dict) and choice.get("type") in ("any", _AUTO, _NONE):  # Anthropic's forms
        return tool_choice(choice["type"], names)
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name") or choice.get("name")
    if isinstance(choice, str) and choice in names:
        return choice
    raise InvalidCallOptionError(f"unknown tool_choice {choice!r}; use 'auto', 'any' (or 'required'), 'none', "
                                 f"or the name of a bound tool: {', '.join(names) or 'none are bound'}")


def system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The instruction that offers ``tools`` in the fallback format."""
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
    return (f"You can call these tools:\n<tools>\n{listing}\n</tools>\n"
            f"To call a tool, reply with\n{OPEN}\n"
            '{"name": <tool name>, "arguments": <arguments as a JSON object>}\n'
            f"{CLOSE}\nEach tool's result comes back in a tool message. "
            "When you have what you need, answer in plain text.")


def format_call(name: str, args: dict[str, Any]) -> str:
    """One call as the model writes it."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{CLOSE}"


def with_tools(chat: list[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """Chat dicts in the fallback format: tools offered in the system message, calls written as text."""
    out = []
    for message in chat:
        calls = message.get("tool_calls") or ()
        text = "\n".join([message["content"], *(format_call(c["name"], c["args"]) for c in calls)]).strip()
        out.append({"role": message["role"], "content": text})
    if tools:
        prompt = system_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """JSON schema of one call of ``tool``: its name and its arguments."""
    fn = tool["function"]
    return {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": fn["parameters"]},
            "required": ["name", "arguments"], "additionalProperties": False}


def forced_grammar(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """JSON schema for an output that is exactly one call of one of ``tools`` (written after ``<tool_call>``)."""
    schemas = [call_schema(t) for t in tools]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}


def auto_grammar(tools: Sequence[dict[str, Any]]) -> str:
    """Structural tag: free text, and any ``<tool_call>`` the model opens is held to its tool's schema."""
    structures = [{"begin": f'{OPEN}\n{{"name": {json.dumps(t["function"]["name"], ensure_ascii=False)}, '
                            '"arguments": ',
                   "schema": t["function"]["parameters"], "end": f"}}\n{CLOSE}"} for t in tools]
    return json.dumps({"type": "structural_tag", "structures": structures, "triggers": [OPEN]}, ensure_ascii=False)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _parse_call(body: str, names: Sequence[str]) -> ToolCall | InvalidToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return InvalidToolCall(type="invalid_tool_call", name=None, args=body, id=_call_id(),
                               error=f"the tool call is not valid JSON: {exc}")
    name = data.get("name") if isinstance(data, dict) else None
    args = data.get("arguments", {}) if isinstance(data, dict) else None
    if name not in names or not isinstance(args, dict):
        return InvalidToolCall(type="invalid_tool_call", name=name if isinstance(name, str) else None, args=body,
                               id=_call_id(), error=f"a tool call must be {{\"name\": one of {list(names)}, "
                                                    "\"arguments\": {...}}")
    return ToolCall(type="tool_call", name=name, args=args, id=_call_id())


@dataclass(frozen=True)
class ParsedOutput:
    """A tool-enabled output read back: its text, valid calls and calls that did not parse."""

    content: str
    tool_calls: list[ToolCall]
    invalid_tool_calls: list[InvalidToolCall]


def parse_output(text: str, tools: ToolSet) -> ParsedOutput:
    """Read the calls out of an output; a forced output is one call's JSON without its tags."""
    names = tools.names
    bodies = [text.strip()] if tools.forced else [m.group(1) for m in _CALL.finditer(text)]
    content = "" if tools.forced else _CALL.sub("", text).strip()
    calls = [_parse_call(body, names) for body in bodies]
    return ParsedOutput(content, [c for c in calls if c["type"] == "tool_call"],
                        [c for c in calls if c["type"] == "invalid_tool_call"])


@dataclass
class ToolStreamSplitter:
    """Stream the text before a tool call as it comes; hold the calls back until the output is whole.

    What it releases, then what :meth:`close` returns, add up to the content ``invoke`` gives: white
    space is held back at both ends until it is known to sit inside the text.
    """

    tools: ToolSet
    _text: str = ""
    _released: str = ""

    def feed(self, text: str) -> str:
        """Take the next piece of output; return the content it releases."""
        self._text += text
        if self.tools.forced:
            return ""
        at = self._text.find(OPEN)
        end = at if at >= 0 else len(self._text) - marker_suffix(self._text, OPEN)
        visible = self._text[:end].strip()
        piece = visible[len(self._released):] if visible.startswith(self._released) else ""
        self._released += piece
        return piece

    def close(self) -> tuple[str, ParsedOutput]:
        """The content still held back, and the whole output parsed."""
        parsed = parse_output(self._text, self.tools)
        return parsed.content[len(self._released):], parsed
