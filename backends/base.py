"""The Backend extension point: an engine that generates tokens and reports the entropy signal."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agent_gravity._steering import Steering, SteeringSpec
from agent_gravity.backends._adaptive_prefill import PrefillReport
from agent_gravity.backends._compute import ComputeReport, ComputeSpec


@dataclass(frozen=True)
class SamplingSettings:
    """How to sample; temperature 0 is greedy."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    """Return this many top log-probabilities per generated token (-1: the whole vocabulary)."""
    json_schema: dict | None = None
    """Constrain the output to JSON matching this schema (the engine's grammar support)."""
    structural_tag: str | None = None
    """Free text in which each tagged region is held to its schema (xgrammar's structural tag, as JSON)."""
    thinking_token_budget: int | None = None
    """The engine's own fixed reasoning cap, where it has one (vLLM's); the baseline gravity is measured against."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt, already rendered to token ids, with its sampling and steering settings."""

    prompt_ids: Sequence[int]
    sampling: SamplingSettings
    steering: SteeringSpec | None = None
    timeout: float | None = None
    """Seconds the whole generation may take; past it the request is aborted with EngineTimeoutError."""
    session: str | None = None
    """A conversation id: a backend that keeps session KV caches reuses this conversation's cache."""
    compute: ComputeSpec | None = None
    """Make the tokens inside gravity zones cheaper (a backend with ``zone_compute``): drafts checked in one
    pass, zone KV in fewer bits, skipped layers, top-2 sampling."""


@dataclass(frozen=True)
class GenerationDelta:
    """Newly generated tokens of a streaming request, with their entropies."""

    token_ids: list[int]
    text: str
    entropy: list[float]


@dataclass
class GenerationResult:
    """A finished request."""

    response_id: str
    token_ids: list[int]
    text: str
    finish_reason: str
    """``stop`` (end of sequence or a stop string), ``length`` (max_tokens) or ``abort``."""
    prompt_tokens: int
    entropy: list[float] = field(default_factory=list)
    """Entropy (nats) of the distribution each generated token was sampled from: exact, or estimated (see
    ``entropy_bound``)."""
    steering: Steering | None = None
    logprobs: list[dict[int, float]] | None = None
    """Per generated token, the log-probabilities asked for with ``SamplingSettings.logprobs``."""
    session: SessionReport | None = None
    """What the backend's session cache did for this request; None without a session."""
    kv_blocks: KVBlockReport | None = None
    """The paged KV blocks the request held, read from the engine (vLLM); None where there are none."""
    entropy_bound: list[float] | None = None
    """Where ``entropy`` is estimated from a server's top log-probabilities: the most each value can be off by
    (NaN where the token was written by the steering, with no distribution seen). None: ``entropy`` is exact."""
    probe_failures: int = 0
    """Answer probes that failed (a refused key, a server error): each confirmed nothing."""
    compute: ComputeReport | None = None
    """What the zone actions did; None when the request asked for none."""
    prefill: PrefillReport | None = None
    """What adaptive prefill did to the prompt; None when it was prefilled densely (short, continued, or off)."""


@dataclass(frozen=True)
class KVBlockReport:
    """A request's paged KV blocks, read from the engine when it released them."""

    blocks: int
    block_size: int
    """Tokens per block."""
    cached_tokens: int
    """Prompt tokens whose blocks came from the engine's prefix cache (not prefilled again)."""
    engine_blocks_used: int
    """Blocks every request holds together, once this one has finished."""
    engine_blocks_total: int


@dataclass(frozen=True)
class SessionReport:
    """How a request used its conversation's KV cache."""

    id: str
    reused_tokens: int
    """Prompt tokens whose KV came from the session cache: never prefilled again."""
    prefilled_tokens: int
    kv_bytes: int
    """Bytes the session's KV cache holds after the request."""
    reset: str | None = None
    """Why the session started over (its history changed), or None."""


StreamItem = GenerationDelta | GenerationResult


@runtime_checkable
class Backend(Protocol):
    """What ChatGravity needs from an engine. Implementations live one per file in this package."""

    provider: str
    """The ``gen_ai.provider.name`` of the engine, e.g. ``vllm``."""
    model_name: str
    max_context: int
    eos_ids: tuple[int, ...]
    token_texts: Sequence[str]
    """The text of every vocabulary id, in id order."""

    def render(self, messages: Sequence[dict[str, str]], prefill: str = "") -> list[int]:
        """Render chat messages with the model's template, add the assistant prefix and ``prefill``."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special tokens added."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``, special tokens skipped."""
        ...

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        """Yield deltas as tokens are generated, then the GenerationResult last."""
        ...

    def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        """Async form of :meth:`stream`."""
        ...


def drain(items: Iterator[StreamItem]) -> GenerationResult:
    """Consume a stream and return its final result."""
    for item in items:
        if isinstance(item, GenerationResult):
            return item
    raise RuntimeError("backend stream ended without a result")


async def adrain(items: AsyncIterator[StreamItem]) -> GenerationResult:
    """Async form of :func:`drain`."""
    async for item in items:
        if isinstance(item, GenerationResult):
            return item
    raise RuntimeError("backend stream ended without a result")
