"""Message content in the GenAI semantic conventions' JSON form; recorded only when the user opts in. Pure."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from agent_gravity._messages import _role_of, _text_of


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_call", "id": call.get("id"), "name": call["name"], "arguments": call["args"]}


def _parts(message: BaseMessage) -> list[dict[str, Any]]:
    if isinstance(message, ToolMessage):
        return [{"type": "tool_call_response", "id": message.tool_call_id, "response": _text_of(message)}]
    text = _text_of(message)
    parts = [{"type": "text", "content": text}] if text else []
    if isinstance(message, AIMessage):
        parts += [_tool_call(c) for c in message.tool_calls]
    return parts


def input_messages(messages: Sequence[BaseMessage]) -> str:
    """``gen_ai.input.messages``: the chat history sent, as JSON."""
    return json.dumps([{"role": _role_of(m), "parts": _parts(m)} for m in messages], ensure_ascii=False)


def output_messages(reasoning: str, answer: str, tool_calls: Sequence[dict[str, Any]], finish_reason: str) -> str:
    """``gen_ai.output.messages``: the reply, its reasoning, answer and tool calls, as JSON."""
    parts = [{"type": "reasoning", "content": reasoning}] if reasoning else []
    parts += [{"type": "text", "content": answer}] if answer else []
    parts += [_tool_call(c) for c in tool_calls]
    return json.dumps([{"role": "assistant", "parts": parts, "finish_reason": finish_reason}], ensure_ascii=False)
