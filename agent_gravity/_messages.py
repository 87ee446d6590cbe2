"""Wire formats: LangChain messages to chat dicts, engine results to LangChain metadata. Pure functions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata

from agent_gravity._errors import InvalidMessageError
from agent_gravity.backends.base import GenerationResult
from agent_gravity.policies.base import Lock

ROLES = ("system", "user", "assistant", "tool")
_CALL_BLOCKS = ("tool_use", "tool_call", "function_call")


def _text_of(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") in ("reasoning", "thinking"):
            continue  # earlier reasoning is not sent back to the model
        elif isinstance(block, dict) and block.get("type") in _CALL_BLOCKS and isinstance(message, AIMessage):
            continue  # the message's tool_calls carry the calls
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidMessageError(f"content blocks of type {kind!r} are not supported; send text only")
    return "".join(parts)


def _role_of(message: BaseMessage) -> str:
    if isinstance(message, SystemMessage):
        return "system"
    if isinstance(message, HumanMessage):
        return "user"
    if isinstance(message, AIMessage):
        return "assistant"
    if isinstance(message, ToolMessage):
        return "tool"
    if isinstance(message, ChatMessage):
        if message.role not in ROLES:
            raise InvalidMessageError(f"unknown message role {message.role!r}; use one of {', '.join(ROLES)}")
        return message.role
    raise InvalidMessageError(
        f"unsupported message type {type(message).__name__} (role {message.type!r}); "
        "use SystemMessage, HumanMessage, AIMessage, ToolMessage or ChatMessage"
    )


def _chat_dict(message: BaseMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": _role_of(message), "content": _text_of(message)}
    if isinstance(message, AIMessage) and message.tool_calls:
        out["tool_calls"] = [{"name": c["name"], "args": c["args"]} for c in message.tool_calls]
    return out


def to_chat_dicts(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """Convert LangChain messages to ``{"role", "content"}`` dicts (plus an AI message's ``tool_calls``)."""
    if not messages:
        raise InvalidMessageError("the message list is empty; pass at least one message")
    return [_chat_dict(m) for m in messages]


def usage_metadata(result: GenerationResult) -> UsageMetadata:
    """Token usage of one generation."""
    output = len(result.token_ids)
    usage = UsageMetadata(input_tokens=result.prompt_tokens, output_tokens=output,
                          total_tokens=result.prompt_tokens + output)
    reasoning, _ = _split_counts(result)
    if reasoning:
        usage["output_token_details"] = {"reasoning": reasoning}
    return usage


def _split_counts(result: GenerationResult) -> tuple[int, int]:
    """(reasoning tokens, answer tokens) of a generation."""
    steering, total = result.steering, len(result.token_ids)
    if steering is None or steering.spec.reasoning is None:
        return 0, total
    if steering.answer_start is None:  # stopped before the answer began (a stop string, or aborted)
        return total, 0
    return steering.reasoning_tokens or 0, total - steering.answer_start


def _lock(lock: Lock | None) -> dict[str, Any] | None:
    if lock is None:
        return None
    return {"step": lock.step, "policy": lock.policy, "reason": lock.reason, "values": dict(lock.values)}


def _tokens_saved_upper_bound(result: GenerationResult, budget: int) -> int:
    """Tokens the budget still allowed where gravity cut the output: the reasoning budget left at an early exit,
    the whole budget left at a stopped loop; an upper bound on what the cut saved, 0 when nothing was cut."""
    steering = result.steering
    if steering is None or not steering.terminated_early:
        return 0
    if steering.stopped is not None:
        return max(0, budget - len(result.token_ids))
    return max(0, steering.spec.reasoning.max_reasoning_tokens - (steering.reasoning_tokens or 0))


def gravity_metadata(result: GenerationResult, budget: int) -> dict[str, Any]:
    """What gravity saw and did during one generation of at most ``budget`` tokens, for
    ``response_metadata["gravity"]``."""
    steering = result.steering
    reasoning_tokens, answer_tokens = _split_counts(result)
    answer_started = steering is None or steering.spec.reasoning is None or steering.answer_start is not None
    lock = (steering.stopped or steering.lock) if steering else None
    early = bool(steering and steering.terminated_early)
    probes = steering.probes if steering else None
    finite = [e for e in result.entropy if math.isfinite(e)]
    return {
        "enabled": bool(steering and not steering.spec.structured
                        and (steering.spec.policy or steering.spec.loop or steering.spec.probe)),
        "terminated_early": early,
        "reason": steering.reason if steering else None,
        "detail": lock.describe() if lock and early else None,
        "lock_step": lock.step if lock else None,
        "trigger": dict(lock.values) if lock else None,
        "lock": _lock(steering.lock) if steering else None,
        "exit": steering.exit.value if steering and steering.exit else None,
        "loop_stop": _lock(steering.stopped) if steering else None,
        "probes": len(probes.records) if probes else 0,
        "probe_steps": [r.step for r in probes.records] if probes else [],
        "probe_answers": [r.answer for r in probes.records] if probes else [],
        "probe_confidence": [r.confidence for r in probes.records] if probes else [],
        "probe_tokens": probes.tokens if probes else 0,
        "probe_failures": result.probe_failures,
        "reasoning_tokens": reasoning_tokens,
        "answer_tokens": answer_tokens,
        "tokens_saved_upper_bound": _tokens_saved_upper_bound(result, budget),
        "answer_complete": answer_started and result.finish_reason == "stop" and not (steering and steering.stopped),
        "entropy": list(result.entropy),
        "entropy_mean": sum(finite) / len(finite) if finite else None,
        "kv_blocks": dataclasses.asdict(result.kv_blocks) if result.kv_blocks else None,
        "compute": result.compute.as_dict() if result.compute else None,
        "prefill": result.prefill.as_dict() if result.prefill else None,
    }
