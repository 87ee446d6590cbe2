"""Spans: ``chat {model}``, ``invoke_agent {name}`` and ``execute_tool {name}`` under the caller's active span,
GenAI semantic conventions plus gravity attributes, in the mode the user chose (own, enrich, off)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from agent_gravity import __version__
from agent_gravity._config import TelemetryConfig

GRAVITY_PREFIX = "agent_gravity."
_log = logging.getLogger(__name__)


def _tracer() -> trace.Tracer:
    return trace.get_tracer("agent_gravity", __version__)


def request_attributes(provider: str, model: str, params: dict[str, Any]) -> dict[str, Any]:
    """GenAI request attributes of a chat call."""
    attrs: dict[str, Any] = {
        gen_ai.GEN_AI_OPERATION_NAME: "chat",
        gen_ai.GEN_AI_PROVIDER_NAME: provider,
        gen_ai.GEN_AI_REQUEST_MODEL: model,
        gen_ai.GEN_AI_REQUEST_TEMPERATURE: params.get("temperature"),
        gen_ai.GEN_AI_REQUEST_TOP_P: params.get("top_p"),
        gen_ai.GEN_AI_REQUEST_MAX_TOKENS: params.get("max_tokens"),
        gen_ai.GEN_AI_REQUEST_SEED: params.get("seed"),
    }
    return {k: v for k, v in attrs.items() if v is not None}


_ROUTE_ATTRIBUTES = ("route", "direct_score", "direct_below", "probe_tokens", "tier", "escalated", "why", "score",
                     "quantile", "escalate_above", "carried_tokens", "carried_from")


def response_attributes(
    model: str, response_id: str, finish_reason: str, usage: dict[str, int], gravity: dict[str, Any]
) -> dict[str, Any]:
    """GenAI response and gravity attributes of a finished chat call; never any message text."""
    entropy = [e for e in gravity.get("entropy", []) if e == e]
    attrs: dict[str, Any] = {
        gen_ai.GEN_AI_RESPONSE_MODEL: model,
        gen_ai.GEN_AI_RESPONSE_ID: response_id,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (finish_reason,),
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: usage["input_tokens"],
        gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: usage["output_tokens"],
        GRAVITY_PREFIX + "enabled": gravity["enabled"],
        GRAVITY_PREFIX + "terminated_early": gravity["terminated_early"],
        GRAVITY_PREFIX + "reasoning_tokens": gravity["reasoning_tokens"],
        GRAVITY_PREFIX + "answer_tokens": gravity["answer_tokens"],
        GRAVITY_PREFIX + "answer_complete": gravity["answer_complete"],
        GRAVITY_PREFIX + "probes": gravity["probes"],
        GRAVITY_PREFIX + "probe_tokens": gravity["probe_tokens"],
    }
    if gravity["reason"]:
        attrs[GRAVITY_PREFIX + "reason"] = gravity["reason"]
    if gravity["lock_step"] is not None:
        attrs[GRAVITY_PREFIX + "lock_step"] = gravity["lock_step"]
    route = gravity.get("route")
    if route:  # values only: the probe's answer is content, recorded with capture_content alone
        attrs.update({GRAVITY_PREFIX + f"route.{k}": route[k] for k in _ROUTE_ATTRIBUTES if route.get(k) is not None})
        if route.get("tried"):
            attrs[GRAVITY_PREFIX + "route.escalated_from"] = tuple(t["tier"] for t in route["tried"])
    risk = gravity.get("risk")
    if risk:
        attrs.update({GRAVITY_PREFIX + f"risk.{k}": v for k, v in risk.items() if v is not None})
    prefill = gravity.get("prefill")
    if prefill:
        attrs.update({GRAVITY_PREFIX + f"prefill.{k}": v for k, v in prefill.items()})
    if entropy:
        attrs[GRAVITY_PREFIX + "entropy.mean"] = sum(entropy) / len(entropy)
        attrs[GRAVITY_PREFIX + "entropy.min"] = min(entropy)
        attrs[GRAVITY_PREFIX + "entropy.max"] = max(entropy)
    return {**attrs, **_kv_attributes(gravity)}


def _kv_attributes(gravity: dict[str, Any]) -> dict[str, Any]:
    """What the call's KV cache held: a session's bytes before and after this call's 8-bit zones and trim,
    and the paged blocks an engine reports."""
    attrs: dict[str, Any] = {}
    session = gravity.get("session")
    if session:
        done = [r for r in (session.get("quantize"), session.get("trim")) if r]
        attrs[GRAVITY_PREFIX + "kv.bytes_before"] = done[0]["bytes_before"] if done else session["kv_bytes"]
        attrs[GRAVITY_PREFIX + "kv.bytes_after"] = done[-1]["bytes_after"] if done else session["kv_bytes"]
        attrs[GRAVITY_PREFIX + "kv.reused_tokens"] = session["reused_tokens"]
    blocks = gravity.get("kv_blocks")
    if blocks:
        attrs[GRAVITY_PREFIX + "kv.blocks"] = blocks["blocks"]
        attrs[GRAVITY_PREFIX + "kv.block_size"] = blocks["block_size"]
        attrs[GRAVITY_PREFIX + "kv.cached_tokens"] = blocks["cached_tokens"]
    return attrs


def set_attributes(span: Span, attrs: dict[str, Any]) -> None:
    """Set attributes; telemetry trouble is logged, never raised into the model call."""
    try:
        span.set_attributes(attrs)
    except Exception:  # noqa: BLE001
        _log.warning("could not record span attributes", exc_info=True)


@contextmanager
def _span(mode: str, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Iterator[Span]:
    """Open a span under the caller's active span (``own``), or lend the caller's span (``enrich``), or none
    (``off``); an error is recorded on a span of ours and raised on."""
    if mode != "own":
        span = trace.get_current_span() if mode == "enrich" else INVALID_SPAN
        set_attributes(span, attributes)
        yield span
        return
    with _tracer().start_as_current_span(name, kind=kind, attributes=attributes, record_exception=False,
                                         set_status_on_exception=False) as span:
        try:
            yield span
        except GeneratorExit:  # a stream the caller stopped reading: not an error
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            span.set_attribute("error.type", type(exc).__qualname__)
            raise


def chat_span(config: TelemetryConfig, provider: str, model: str, params: dict[str, Any]) -> Any:
    """Open ``chat {model}`` as a client span under the caller's active span."""
    return _span(config.spans, f"chat {model}", SpanKind.CLIENT, request_attributes(provider, model, params))


def agent_span(config: TelemetryConfig, name: str) -> Any:
    """Open ``invoke_agent {name}``: one agent run, its model and tool calls nest under it."""
    return _span(config.spans, f"invoke_agent {name}", SpanKind.INTERNAL,
                 {gen_ai.GEN_AI_OPERATION_NAME: "invoke_agent", gen_ai.GEN_AI_AGENT_NAME: name})


def tool_span(config: TelemetryConfig, name: str, call_id: str | None) -> Any:
    """Open ``execute_tool {name}`` for one tool call."""
    attrs = {gen_ai.GEN_AI_OPERATION_NAME: "execute_tool", gen_ai.GEN_AI_TOOL_NAME: name}
    if call_id:
        attrs[gen_ai.GEN_AI_TOOL_CALL_ID] = call_id
    return _span(config.spans, f"execute_tool {name}", SpanKind.INTERNAL, attrs)


def add_event(span: Span, name: str, attributes: dict[str, Any]) -> None:
    """Add a span event; telemetry trouble is logged, never raised into the model call."""
    try:
        span.add_event(name, attributes)
    except Exception:  # noqa: BLE001
        _log.warning("could not record span event %s", name, exc_info=True)


def trace_headers() -> dict[str, str]:
    """W3C ``traceparent`` (and ``tracestate``) of the active span, for requests to a remote vLLM server, so that
    its own ``llm_request`` span nests under ours."""
    from opentelemetry.propagate import inject

    headers: dict[str, str] = {}
    inject(headers)
    return headers
