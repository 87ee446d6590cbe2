"""One model call's telemetry: its span (or the caller's), events, opt-in content, metrics and entropy trace."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import Span

from agent_gravity._config import TelemetryConfig
from agent_gravity.telemetry._content import input_messages
from agent_gravity.telemetry._events import gravity_events
from agent_gravity.telemetry._metrics import record_call, record_failure
from agent_gravity.telemetry._spans import GRAVITY_PREFIX, add_event, chat_span, response_attributes, set_attributes
from agent_gravity.telemetry._trace_file import trace_path, trace_record, write_record

T = TypeVar("T")
_log = logging.getLogger(__name__)


@dataclass
class ChatTelemetry:
    """Telemetry of one chat call in progress; ``finish`` records what it did."""

    config: TelemetryConfig
    span: Span
    model: str
    metric_attributes: dict[str, Any]
    started: float
    first_chunk: float | None = None

    def _mark(self) -> None:
        if self.first_chunk is None:
            self.first_chunk = time.perf_counter() - self.started

    def timed(self, items: Iterator[T]) -> Iterator[T]:
        """Pass a backend's stream through, noting when its first item arrived."""
        for item in items:
            self._mark()
            yield item

    async def atimed(self, items: AsyncIterator[T]) -> AsyncIterator[T]:
        """Async form of :meth:`timed`."""
        async for item in items:
            self._mark()
            yield item

    def finish(self, response_id: str, finish_reason: str, usage: dict[str, int], gravity: dict[str, Any],
               trace_header: dict[str, Any], output: Callable[[], str]) -> None:
        """Record the finished call: attributes, events, opt-in output content, metrics, entropy trace line.
        ``output`` makes ``gen_ai.output.messages``; it runs only when content capture is on."""
        attrs = response_attributes(self.model, response_id, finish_reason, usage, gravity)
        if self.first_chunk is not None:
            attrs[gen_ai.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = self.first_chunk
        if self.config.capture_content:
            attrs[gen_ai.GEN_AI_OUTPUT_MESSAGES] = _safely(output)
            attrs[GRAVITY_PREFIX + "probe_answers"] = tuple(a or "" for a in gravity.get("probe_answers", ()))
            if (gravity.get("route") or {}).get("probe_answer") is not None:
                attrs[GRAVITY_PREFIX + "route.probe_answer"] = gravity["route"]["probe_answer"]
        set_attributes(self.span, {k: v for k, v in attrs.items() if v is not None})
        for name, event in gravity_events(gravity, usage["output_tokens"]):
            add_event(self.span, name, event)
        record_call({**self.metric_attributes, gen_ai.GEN_AI_RESPONSE_MODEL: self.model},
                    time.perf_counter() - self.started, self.first_chunk, usage, gravity)
        path = trace_path(self.config.trace_file)
        if path is not None:
            write_record(path, trace_record({"response_id": response_id, "model": self.model, **trace_header},
                                            gravity))


def _safely(make: Callable[[], str]) -> str | None:
    try:
        return make()
    except Exception:  # noqa: BLE001 - telemetry never breaks a model call
        _log.warning("could not record message content", exc_info=True)
        return None


@contextmanager
def chat_telemetry(config: TelemetryConfig, provider: str, model: str, params: dict[str, Any],
                   conversation_id: str | None, messages: Sequence[BaseMessage]) -> Iterator[ChatTelemetry]:
    """Open a chat call's telemetry: ``chat {model}`` under the caller's active span, in ``config``'s mode."""
    base = {gen_ai.GEN_AI_OPERATION_NAME: "chat", gen_ai.GEN_AI_PROVIDER_NAME: provider,
            gen_ai.GEN_AI_REQUEST_MODEL: model}
    started = time.perf_counter()
    with chat_span(config, provider, model, params) as span:
        attrs: dict[str, Any] = {gen_ai.GEN_AI_CONVERSATION_ID: conversation_id}
        if config.capture_content:
            attrs[gen_ai.GEN_AI_INPUT_MESSAGES] = _safely(lambda: input_messages(messages))
        set_attributes(span, {k: v for k, v in attrs.items() if v is not None})
        try:
            yield ChatTelemetry(config, span, model, base, started)
        except GeneratorExit:  # a stream the caller stopped reading: not a failure
            raise
        except BaseException as exc:
            record_failure(base, time.perf_counter() - started, exc)
            raise
