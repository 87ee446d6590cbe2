"""Metrics: GenAI client token usage, duration and time to first chunk, plus gravity's exits, savings and KV freed.

Instruments come from the global MeterProvider (a no-op until the application sets one); recording
never raises into a model call.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from agent_gravity import __version__
from agent_gravity.telemetry._spans import GRAVITY_PREFIX

EXITS = GRAVITY_PREFIX + "exits"
TOKENS_SAVED_UPPER_BOUND = GRAVITY_PREFIX + "tokens_saved_upper_bound"
KV_BYTES_FREED = GRAVITY_PREFIX + "kv.bytes_freed"
PROBE_FAILURES = GRAVITY_PREFIX + "probe_failures"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Instruments:
    token_usage: Histogram
    duration: Histogram
    first_chunk: Histogram
    exits: Counter
    tokens_saved_upper_bound: Histogram
    kv_freed: Histogram
    probe_failures: Counter


@functools.cache
def _instruments() -> _Instruments:
    meter = metrics.get_meter("agent_gravity", __version__)
    return _Instruments(
        token_usage=gen_ai_metrics.create_gen_ai_client_token_usage(meter),
        duration=gen_ai_metrics.create_gen_ai_client_operation_duration(meter),
        first_chunk=gen_ai_metrics.create_gen_ai_client_operation_time_to_first_chunk(meter),
        exits=meter.create_counter(EXITS, unit="{call}",
                                   description="Model calls by how their output ended (agent_gravity.reason)."),
        tokens_saved_upper_bound=meter.create_histogram(
            TOKENS_SAVED_UPPER_BOUND, unit="{token}",
            description="Tokens the budget still allowed where gravity cut a call's output (an upper bound)."),
        kv_freed=meter.create_histogram(KV_BYTES_FREED, unit="By",
                                        description="Bytes a session's KV cache gave up to 8-bit zones and trimming."),
        probe_failures=meter.create_counter(
            PROBE_FAILURES, unit="{probe}",
            description="Answer probes that failed (a refused key, a server error); each confirmed no exit."),
    )


def _guarded(fn: Any) -> Any:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - metrics never break a model call
            _log.warning("could not record metrics", exc_info=True)
    return run


@_guarded
def record_call(base: dict[str, Any], seconds: float, first_chunk: float | None, usage: dict[str, int],
                gravity: dict[str, Any]) -> None:
    """Record one finished call; ``base`` holds its operation, provider and model attributes."""
    m = _instruments()
    m.duration.record(seconds, base)
    if first_chunk is not None:
        m.first_chunk.record(first_chunk, base)
    for kind, key in (("input", "input_tokens"), ("output", "output_tokens")):
        m.token_usage.record(usage[key], {**base, gen_ai.GEN_AI_TOKEN_TYPE: kind})
    if gravity["reason"]:
        m.exits.add(1, {**base, GRAVITY_PREFIX + "reason": gravity["reason"],
                        GRAVITY_PREFIX + "terminated_early": gravity["terminated_early"]})
    if gravity["terminated_early"]:
        m.tokens_saved_upper_bound.record(gravity["tokens_saved_upper_bound"],
                                          {**base, GRAVITY_PREFIX + "reason": gravity["reason"]})
    freed = kv_bytes_freed(gravity)
    if freed:
        m.kv_freed.record(freed, base)
    if gravity.get("probe_failures"):
        m.probe_failures.add(gravity["probe_failures"], base)


@_guarded
def record_failure(base: dict[str, Any], seconds: float, error: BaseException) -> None:
    """Record the duration of a call that failed, with its ``error.type``."""
    _instruments().duration.record(seconds, {**base, "error.type": type(error).__qualname__})


def kv_bytes_freed(gravity: dict[str, Any]) -> int:
    """Bytes this call's 8-bit zones and trim took off its session's KV cache."""
    session = gravity.get("session") or {}
    return sum(r["bytes_before"] - r["bytes_after"] for r in (session.get("quantize"), session.get("trim")) if r)
