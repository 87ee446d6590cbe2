"""Tiered models: a call starts on the cheapest tier and goes up while the tier's output is unsure.

Each tier is a ChatGravity of its own (any backend), so a tier's call is an ordinary call with its own span;
the route record (``response_metadata["gravity"]["route"]``) says which tier answered, what each escalation
read, and why it went up. A tier whose output stands streams it as it was written; one that escalates is
held back whole, since only its finished output says whether it stands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from agent_gravity._config import RouteConfig
from agent_gravity._route import escalation, sure_reasoning
from agent_gravity.backends.base import GenerationResult, StreamItem

if TYPE_CHECKING:
    from agent_gravity._chat_model import ChatGravity, _Call


@dataclass
class Cascade:
    """The tiers of a chat model, cheapest first, and the route that moves a call between them."""

    names: tuple[str, ...]
    models: tuple[ChatGravity, ...]
    route: RouteConfig
    task: str | None = None
    """The chat model's default task type (a call's ``task`` option replaces it)."""
    own_gravity: tuple[bool, ...] = ()
    """Which tiers set their own gravity: a call's ``gravity`` option applies to the others only."""
    _tokenizers: dict[tuple[int, int], bool] = field(default_factory=dict, init=False, repr=False)

    def path(self, kwargs: dict[str, Any]) -> list[int]:
        """The tiers a call may run on, in order: one pinned by ``route.tasks``, only the last for tool and
        structured calls (unless the route takes them), else all of them."""
        route = kwargs.get("route") or self.route
        kind = "tools" if kwargs.get("tools") else "structured" if kwargs.get("response_format") is not None else None
        pinned = route.tasks.get(kwargs.get("task", self.task) or "") or route.tasks.get(kind or "")
        if pinned is not None:
            return [self.names.index(pinned)]
        if (kind == "tools" and not route.tools) or (kind == "structured" and not route.structured):
            return [len(self.models) - 1]
        return list(range(len(self.models)))

    def _judged(self, index: int, call: _Call, result: GenerationResult, final: bool, tried: list[dict[str, Any]],
                route: RouteConfig) -> _Call:
        """``call`` with its route record: whether its output goes up a tier (never from the last one)."""
        _, answer, calls, _ = self.models[index]._parsed(call, result)
        probes = result.steering.probes.records if result.steering and result.steering.probes else []
        verdict = escalation(result.entropy, [r.answer for r in probes], bool(answer.strip() or calls),
                             route.escalate_quantile, route.escalate_above, route.escalate_unsettled)
        record = verdict.record(self.names[index], route.escalate_quantile, route.escalate_above)
        if final:
            record.update(escalated=False, why=None)
        record["tried"] = list(tried)
        tried.append({**{k: record[k] for k in ("tier", "escalated", "why", "score")},
                      "output_tokens": len(result.token_ids)})
        return dataclasses.replace(call, route={**(call.route or {}), **record})

    def options(self, index: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A call's options for one tier: a tier with its own gravity keeps it."""
        return {k: v for k, v in kwargs.items() if not (k == "gravity" and self.own_gravity[index])}

    def _prepared(self, index: int, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any],
                  below: tuple[int, _Call, GenerationResult] | None, route: RouteConfig) -> _Call:
        """Tier ``index``'s call; after an escalation, continuing the reasoning the tier below was sure of."""
        call = self.models[index]._prepare(messages, stop, self.options(index, kwargs))
        if below is None or not route.carry or call.fmt is None or call.tools:
            return call
        low, low_call, result = below
        if low_call.fmt != call.fmt or not self._shared(low, index):
            return call
        prompt = low_call.request.prompt_ids
        carried = [*prompt[len(prompt) - (low_call.route or {}).get("carried_tokens", 0):],
                   *sure_reasoning(result, low_call.fmt.end, call.backend.decode, route.escalate_quantile,
                                  route.escalate_above)]
        return _continued(call, carried, self.names[low]) if carried else call

    def _shared(self, low: int, high: int) -> bool:
        """Whether two tiers' token ids mean the same text (one tokenizer)."""
        a, b = (self.models[i].get_backend() for i in (low, high))
        if a is b:
            return True
        key = (id(a), id(b))
        if key not in self._tokenizers:
            self._tokenizers[key] = len(a.token_texts) == len(b.token_texts) and list(a.token_texts) == list(
                b.token_texts) and a.eos_ids == b.eos_ids
        return self._tokenizers[key]

    def generate(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> ChatResult:
        climb = _Climb(self, messages, stop, kwargs)
        for step in climb:
            with step.model._telemetry(step.call, messages) as tel:
                *_, (call, result) = step.model._run(step.call, tel)
                call = climb.judged(step, call, result)
                message = step.model._message(call, result, tel)
            if not call.route["escalated"]:
                return ChatResult(generations=[ChatGeneration(message=message)])
        raise AssertionError("the last tier always answers")

    async def agenerate(self, messages: list[BaseMessage], stop: list[str] | None,
                        kwargs: dict[str, Any]) -> ChatResult:
        climb = _Climb(self, messages, stop, kwargs)
        for step in climb:
            with step.model._telemetry(step.call, messages) as tel:
                *_, (call, result) = [pair async for pair in step.model._arun(step.call, tel)]
                call = climb.judged(step, call, result)
                message = step.model._message(call, result, tel)
            if not call.route["escalated"]:
                return ChatResult(generations=[ChatGeneration(message=message)])
        raise AssertionError("the last tier always answers")

    def stream(self, messages: list[BaseMessage], stop: list[str] | None,
               kwargs: dict[str, Any]) -> Iterator[ChatGenerationChunk]:
        climb = _Climb(self, messages, stop, kwargs)
        for step in climb:
            with step.model._telemetry(step.call, messages) as tel:
                items = step.model._run(step.call, tel)
                if step.final:
                    yield from climb.chunks(step, items, tel)
                    return
                held = list(items)
                if not climb.escalated(step, held, tel):
                    yield from climb.chunks(step, held, tel, judge=False)
                    return

    async def astream(self, messages: list[BaseMessage], stop: list[str] | None,
                      kwargs: dict[str, Any]) -> AsyncIterator[ChatGenerationChunk]:
        climb = _Climb(self, messages, stop, kwargs)
        for step in climb:
            with step.model._telemetry(step.call, messages) as tel:
                items = step.model._arun(step.call, tel)
                if step.final:
                    splitter = None
                    async for routed, item in items:
                        routed = climb.judged(step, routed, item) if isinstance(item, GenerationResult) else routed
                        splitter = splitter or step.model._splitter(routed)
                        yield step.model._chunk(routed, item, splitter, tel)
                    return
                held = [pair async for pair in items]
                if not climb.escalated(step, held, tel):
                    for chunk in climb.chunks(step, held, tel, judge=False):
                        yield chunk
                    return


@dataclass
class _Step:
    """A call's turn on one tier: the tier's chat model and the call prepared for it."""

    index: int
    final: bool
    model: ChatGravity
    call: _Call


class _Climb:
    """One call's way up the tiers: the tiers tried so far, and the output an escalated call may continue."""

    def __init__(self, cascade: Cascade, messages: list[BaseMessage], stop: list[str] | None,
                 kwargs: dict[str, Any]) -> None:
        self.cascade, self.messages, self.stop, self.kwargs = cascade, messages, stop, kwargs
        self.route: RouteConfig = kwargs.get("route") or cascade.route
        self.tried: list[dict[str, Any]] = []
        self.below: tuple[int, _Call, GenerationResult] | None = None

    def __iter__(self) -> Iterator[_Step]:
        path = self.cascade.path(self.kwargs)
        for n, index in enumerate(path):
            call = self.cascade._prepared(index, self.messages, self.stop, self.kwargs, self.below, self.route)
            yield _Step(index, n == len(path) - 1, self.cascade.models[index], call)

    def judged(self, step: _Step, call: _Call, result: GenerationResult) -> _Call:
        """``call`` with its route record; an output that goes up is kept for the next tier to continue."""
        call = self.cascade._judged(step.index, call, result, step.final, self.tried, self.route)
        if call.route["escalated"]:
            self.below = step.index, call, result
        return call

    def escalated(self, step: _Step, held: list[tuple[_Call, StreamItem]], tel: Any) -> bool:
        """Judge a held output: when it goes up, its span is finished here and its chunks are never sent."""
        call = self.judged(step, held[-1][0], held[-1][1])
        held[-1] = call, held[-1][1]
        if call.route["escalated"]:
            step.model._message_fields(call, held[-1][1], tel)
        return call.route["escalated"]

    def chunks(self, step: _Step, items: Iterator[tuple[_Call, StreamItem]] | Sequence[tuple[_Call, StreamItem]],
               tel: Any, judge: bool = True) -> Iterator[ChatGenerationChunk]:
        """The chunks of a tier's output that stands; ``judge``: its result is judged as it arrives (else it was
        judged while held)."""
        splitter = None
        for routed, item in items:
            if judge and isinstance(item, GenerationResult):
                routed = self.judged(step, routed, item)
            splitter = splitter or step.model._splitter(routed)
            yield step.model._chunk(routed, item, splitter, tel)


def _continued(call: _Call, carried: list[int], source: str) -> _Call:
    """``call`` continuing ``carried`` reasoning tokens another tier wrote: they end its prompt, and its output and
    reasoning budgets shrink by as many, so the whole output stays within them."""
    request, n = call.request, len(carried)
    steering = request.steering
    if steering is not None and steering.reasoning is not None:
        budget = max(1, steering.reasoning.max_reasoning_tokens - n)
        steering = dataclasses.replace(steering, reasoning=dataclasses.replace(steering.reasoning,
                                                                               max_reasoning_tokens=budget))
    sampling = dataclasses.replace(request.sampling, max_tokens=max(1, request.sampling.max_tokens - n))
    request = dataclasses.replace(request, prompt_ids=[*request.prompt_ids, *carried], sampling=sampling,
                                  steering=steering)
    return dataclasses.replace(call, request=request, direct=None, carried=call.backend.decode(carried),
                               route={**(call.route or {}), "carried_tokens": n, "carried_from": source})
