"""Configuration at the public boundary: one pydantic model per concept."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from agent_gravity._limits import (
    MAX_DRAFT,
    MAX_LAYERS,
    MAX_NATS,
    MAX_PROBE_TOKENS,
    MAX_TEXT,
    MAX_TOKENS,
    MAX_WINDOW,
    bounded,
)
from agent_gravity._probe import PROBE_LIMITS, ProbeSpec
from agent_gravity.backends._compute import ComputeSpec
from agent_gravity.backends._layer_skip import SkipSpec
from agent_gravity.backends._speculation import DraftSpec
from agent_gravity.backends._top2 import Top2Spec
from agent_gravity.backends._zone_kv import ZoneKVSpec
from agent_gravity.policies import policy_from_spec

if TYPE_CHECKING:
    from agent_gravity._profile import LayerCalibration


class ReasoningFormat(BaseModel):
    """How reasoning is delimited in the output: ``start`` reasoning ``end`` ``answer_prefix`` answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str = Field("<think>\n", max_length=MAX_TEXT)
    end: str = Field("</think>", min_length=1, max_length=MAX_TEXT)
    answer_prefix: str = Field("\nAnswer:", max_length=MAX_TEXT)
    scaffold: bool = True
    """Teach the format with an instruction and a one-shot example (for models with no native one)."""
    prefill_start: bool = True
    """Put ``start`` at the end of the prompt so the model begins inside its reasoning."""

    def engine_markers(self) -> tuple[str, str]:
        """vLLM's reasoning strings for this format: its ``thinking_token_budget`` counts after the start and forces
        the end plus the answer prefix."""
        return self.start.strip(), self.end + self.answer_prefix


NATIVE_THINK = ReasoningFormat(start="<think>\n", end="</think>", answer_prefix="\n\n", scaffold=False)


DEFAULT_POLICY: dict[str, Any] = {"name": "all_of", "within": 4, "policies": [
    {"name": "window_mean", "window": 8, "threshold": 1.2, "patience": 2},
    {"name": "ewma", "alpha": 0.15, "threshold": 1.4, "varentropy_threshold": 3.0},
]}
"""A windowed-mean lock confirmed by EWMA of entropy and varentropy. With the default probes it is the
configuration ``agent-gravity bench savings`` and ``calibrate`` found best on the embedded model."""

RISKY_TASKS = frozenset({"creative_writing", "legal", "medical", "multi_hop"})


class ProbeConfig(BaseModel):
    """Confirm a lock with short answer probes before ending reasoning."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agree: int = Field(2, ge=1, le=PROBE_LIMITS["agree"])
    """Consecutive probe answers that must agree."""
    tokens: int = Field(10, ge=1, le=PROBE_LIMITS["tokens"])
    """Tokens each probe may write; it stops at the end of the answer's first line."""
    gap: int = Field(8, ge=1, le=PROBE_LIMITS["gap"])
    """Reasoning tokens between two probes."""
    max_probes: int = Field(20, ge=1, le=PROBE_LIMITS["max_probes"])
    """Probes per call: enough that, in a ramble, unsure probes before ``lenient_after`` leave some for after it
    (with 12, rambles that ran into the cap had often spent them all by then)."""
    interval: int | None = Field(32, ge=1, le=PROBE_LIMITS["interval"])
    """Also probe every ``interval`` tokens whatever the policy says (Dynasor-CoT's schedule); None: locks only."""
    min_confidence: float | None = Field(0.8, gt=0.0, le=1.0)
    """A probe answer confirms only if each of its tokens had at least this probability (a least-token variant of
    DEER's trial-answer confidence); None: any settled answer confirms. Unsure probes agreeing on a half-computed
    value were what lost answers on questions worded unlike the tuning set."""
    lenient_after: int | None = Field(64, ge=1, le=PROBE_LIMITS["lenient_after"])
    """Probes from this reasoning step on skip the confidence test: a reasoning that long is most likely a ramble
    whose answer a full run leaves to chance (on the calibration families the embedded model closed 118 of the 122
    reasonings it finished by itself before step 64, and two lenient probes must still agree); None: never."""

    hold: int | None = Field(16, ge=1, le=PROBE_LIMITS["hold"])
    """Reasoning tokens a confident answer must hold before it confirms an exit (the first of the agreeing probes
    started at least this many tokens before the last); probes from ``lenient_after`` on need only ``agree``.
    None: ``agree`` probes suffice. Two confident probes 8 tokens apart sometimes agreed on an intermediate value
    the reasoning then went past; on the development questions 16 kept every settled answer for 2.5 points of
    saving."""

    def spec(self) -> ProbeSpec:
        """The engine-side form."""
        return ProbeSpec(**self.model_dump())


class GravityConfig(BaseModel):
    """When gravity fires and what it may do. Invalid values raise a ValidationError naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """False: same model and format, the entropy trace is still recorded, nothing is cut short."""
    policy: dict[str, Any] | None = Field(default_factory=lambda: copy.deepcopy(DEFAULT_POLICY))
    """Policy spec ``{"name": ..., **params}`` (see ``agent_gravity.policies.POLICIES``) saying when reasoning
    has converged; None relies on ``probe.interval`` alone."""
    probe: ProbeConfig | None = Field(default_factory=ProbeConfig)
    """Confirm each lock with answer probes; None ends reasoning on the policy's word alone."""
    loop: dict[str, Any] | None = Field(default_factory=lambda: {"name": "loop"})
    """Policy spec that stops degenerate loops (reason ``loop``) in reasoning and answer; None never does."""
    min_tokens: int = 16
    """Reasoning tokens before gravity may fire."""
    max_reasoning_tokens: int = 256
    """Reasoning is closed for the model after this many tokens, with or without gravity."""
    max_answer_tokens: int = 256
    """Budget the answer gets after reasoning ends."""
    reasoning: ReasoningFormat | Literal["auto"] | None = "auto"
    """``auto``: the model's native ``<think>`` format if its vocabulary has one, else a scaffold."""
    excluded_tasks: frozenset[str] = RISKY_TASKS
    """Task types (the ``task`` call option) that never end early: the trace is still recorded."""

    @field_validator("min_tokens", "max_reasoning_tokens", "max_answer_tokens")
    @classmethod
    def _token_count(cls, value: int, info: Any) -> int:
        bounded(info.field_name, value, 0 if info.field_name == "min_tokens" else 1, MAX_TOKENS)
        return value

    @field_validator("policy", "loop")
    @classmethod
    def _policy_spec(cls, value: dict[str, Any] | None, info: Any) -> dict[str, Any] | None:
        if value is not None:
            try:
                policy_from_spec(value)
            except ValueError as exc:
                raise ValueError(f"{info.field_name}: {exc}") from exc
        return value

    @field_validator("loop")
    @classmethod
    def _loop_spec(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("name") != "loop":
            raise ValueError(f"loop takes a loop policy spec such as {{'name': 'loop', 'repeats': 3}}, got {value!r}; "
                             "other policies belong in `policy`")
        return value

    @model_validator(mode="after")
    def _can_fire(self) -> GravityConfig:
        if self.enabled and self.min_tokens >= self.max_reasoning_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be below max_reasoning_tokens "
                             f"({self.max_reasoning_tokens}), or gravity could never fire")
        return self

    def active_for(self, task: str | None) -> bool:
        """Whether early exits may fire for a call of this task type."""
        return self.enabled and task not in self.excluded_tasks


class KVConfig(BaseModel):
    """Multi-turn KV: trimming of a chat model's session caches (transformers), and history compaction (any backend).

    After a call with a ``conversation_id``, once the conversation's cache holds more than
    ``trim_above`` tokens written since its last trim, that stretch is trimmed with ``policy``
    to about ``1 / ratio`` per KV head, keeping ``sinks`` and the last ``window`` tokens (what it keeps stored in
    ``kept_bits`` bits, when set). Before
    that, after every such call, the entries read or written inside a gravity zone (``zone_patience``
    tokens whose mean next-token entropy is under ``quantize_below`` nats) are stored in 8 bits
    instead of being trimmed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: dict[str, Any] = Field(default_factory=lambda: {"name": "head_entropy"})
    """A trim policy spec: ``head_entropy``, ``reconstruction``, ``snapkv`` or ``streaming_llm`` with their
    parameters."""
    ratio: float = Field(4.0, ge=1.0, le=MAX_TOKENS, allow_inf_nan=False)
    sinks: int = Field(4, ge=0, le=MAX_WINDOW)
    window: int = Field(32, ge=1, le=MAX_TOKENS)
    trim_above: int = Field(1024, ge=1, le=MAX_TOKENS)
    kept_bits: Literal[8, 4] | None = None
    """Store the entries a trim keeps (past the sinks, before the window; exact values too) in 8 or 4 bits; None
    keeps them at full precision. ``ratio`` still counts entries: with ``policy={"name": "reconstruction"}``,
    ``ratio=1.1, kept_bits=8`` leaves a float32 stretch about 4x fewer bytes."""
    quantize_below: float | None = Field(0.5, gt=0, le=MAX_NATS, allow_inf_nan=False)
    """Entropy (nats) under which a stretch is a gravity zone, stored in 8 bits; None keeps every entry at full
    precision."""
    zone_patience: int = Field(8, ge=1, le=MAX_TOKENS)
    trim: bool = True
    """Trim session caches; False on a backend without them (vLLM), where only compaction applies."""
    compact_tool_outputs: int | None = Field(None, ge=0, le=MAX_TOKENS)
    """Collapse every tool output but the last N to its facts before a call (any backend); None keeps them."""

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, spec: dict[str, Any]) -> dict[str, Any]:
        from agent_gravity.trim import trim_policy_from_spec

        trim_policy_from_spec(spec)  # raises ValueError naming the known policies
        return spec


_Layers = Annotated[tuple[int, ...], Field(min_length=1, max_length=MAX_LAYERS)]


class SpeculationConfig(BaseModel):
    """Lossless self-speculation inside gravity zones (transformers backend).

    The tokens that followed the latest earlier occurrence of the last ``ngram`` tokens (in the prompt or output)
    are drafted, up to ``max_draft`` at a time (adapted to the measured acceptance), and checked in the same
    forward pass as the next token; with ``layers``, the layer-skipped model drafts where the context has no
    match. A draft token is kept only when the token sampled at its position is that token, so the output is the
    model's own at any temperature.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_draft: int = Field(8, ge=1, le=MAX_DRAFT)
    ngram: int = Field(3, ge=1, le=MAX_DRAFT)
    layers: _Layers | Literal["profile"] | None = None
    """Where the context has no match, the model drafts itself with these decoder layers skipped (0-based; the
    check still runs the full model, so the output stays its own); "profile": the layers ``agent-gravity calibrate
    --layers`` chose for the model (context drafts only where it found none that pays); None: context drafts only."""


class ZoneKVConfig(BaseModel):
    """KV entries written inside a gravity zone are stored in ``bits`` bits as decoding goes (one scale per entry
    at 8 bits, per 32 values at 4), except the ``recent`` newest, which stay at full precision (KIVI's residual
    window); packing runs every ``every`` tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bits: Literal[8, 4] = 8
    recent: int = Field(32, ge=1, le=MAX_TOKENS)
    every: int = Field(16, ge=1, le=MAX_TOKENS)


class LayerSkipConfig(BaseModel):
    """Lossy: inside a gravity zone each token is computed without some decoder layers, unchecked. ``layers``
    names them (0-based), or "profile" the layers ``agent-gravity calibrate --layers`` chose for the model; None
    skips the middle ``fraction`` of the model's layers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fraction: float = Field(0.25, gt=0, lt=1)
    layers: _Layers | Literal["profile"] | None = None


class Top2Config(BaseModel):
    """Inside a gravity zone at temperature > 0, sample among the top two tokens alone when the first leads the
    second by at least ``margin`` in probability."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    margin: float = Field(0.5, gt=0, lt=1)


class ComputeConfig(BaseModel):
    """Making the tokens inside a gravity zone cheaper (transformers backend). A zone: the mean next-token entropy
    of the last ``window`` tokens is under ``below`` nats. Inside it, ``speculate`` drafts and checks tokens in
    one pass (lossless, on by default); ``kv`` stores the zone's KV entries in fewer bits; ``skip`` skips middle
    layers (lossy); ``top2`` samples among the top two. None turns an action off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    below: float = Field(1.0, gt=0, le=MAX_NATS, allow_inf_nan=False)
    window: int = Field(4, ge=1, le=MAX_WINDOW)
    speculate: SpeculationConfig | None = Field(default_factory=SpeculationConfig)
    kv: ZoneKVConfig | None = None
    skip: LayerSkipConfig | None = None
    top2: Top2Config | None = None

    @model_validator(mode="after")
    def _lossless_or_not(self) -> ComputeConfig:
        if self.speculate is not None and self.skip is not None:
            raise ValueError("skip computes zone tokens without some layers, unchecked, while speculate promises the "
                             "model's own output: set speculate=None to skip layers, or skip=None")
        return self

    def calibrated(self, layers: LayerCalibration | None, model: str) -> ComputeConfig:
        """This config with ``layers="profile"`` replaced by what calibration chose for ``model`` (``layers``: its
        profile's); ValueError saying how to calibrate when there is nothing to take."""
        update = {}
        if self.speculate is not None and self.speculate.layers == "profile":
            if layers is None:
                raise ValueError(f"speculate.layers='profile' but {model} has no layer calibration: run "
                                 "`agent-gravity calibrate --layers` for it, or name the layers")
            update["speculate"] = self.speculate.model_copy(update={"layers": layers.draft_layers})
        if self.skip is not None and self.skip.layers == "profile":
            if layers is None or layers.skip_layers is None:
                missing = "has no layer calibration" if layers is None else \
                    f"kept no layer set at {layers.skip_target:.0%} top-1 agreement in calibration"
                raise ValueError(f"skip.layers='profile' but {model} {missing}: run `agent-gravity calibrate "
                                 "--layers` (with a lower --skip-agreement), or name the layers")
            update["skip"] = self.skip.model_copy(update={"layers": layers.skip_layers})
        return self.model_copy(update=update)

    def spec(self) -> ComputeSpec:
        """The engine-side form (layers named, not "profile": see ``calibrated``)."""
        def part(cls: type, config: BaseModel | None) -> Any:
            return None if config is None else cls(**config.model_dump())

        return ComputeSpec(self.below, self.window, part(DraftSpec, self.speculate), part(ZoneKVSpec, self.kv),
                           part(SkipSpec, self.skip), part(Top2Spec, self.top2))


class RouteConfig(BaseModel):
    """Which compute a call gets, by entropy: answer without reasoning when a direct answer is sure (``think``),
    and, with ``ChatGravity(tiers=...)``, which tier keeps a call (a cascade from the cheapest tier up).

    A tier's output goes up to the next tier when its per-token entropy ``escalate_quantile`` is above
    ``escalate_above`` nats, when it wrote no answer, or (``escalate_unsettled``) when its answer probes had not
    settled. ``tasks`` pins kinds of work to a tier, with no escalation: a ``task`` call option's value,
    ``structured`` (with_structured_output) or ``tools`` (bind_tools). Tool and structured calls skip the cascade
    (they go to the last tier) unless ``tools``/``structured`` say otherwise or ``tasks`` pins them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    think: Literal["always", "adaptive"] = "always"
    """``adaptive``: before reasoning, the call writes its answer with an empty reasoning; when every token of its
    first line has entropy at most ``direct_below``, that is the answer and reasoning is skipped. Not for tool or
    structured calls (they have no reasoning) nor for task types gravity excludes."""
    direct_below: float | Literal["profile"] = "profile"
    """Nats; ``profile``: the threshold ``agent-gravity calibrate --route`` certified for the model (a call is
    refused when it has none; when calibration certified none, every call reasons and probes nothing)."""
    direct_tokens: int = Field(12, ge=1, le=MAX_PROBE_TOKENS)
    """Tokens of the direct answer read before deciding: its first line, at most this many."""
    escalate_quantile: float = Field(0.9, gt=0, le=1)
    escalate_above: float = Field(1.0, ge=0, le=MAX_NATS, allow_inf_nan=False)
    escalate_unsettled: bool = True
    carry: bool = True
    """When the tiers share a tokenizer, an escalated call continues the longest start of the lower tier's
    reasoning that would have stood by itself (its ``escalate_quantile`` entropy at most ``escalate_above``):
    prefilled, not written again, and counted in the reasoning budget. False: it starts over."""
    tasks: dict[str, str] = Field(default_factory=dict)
    """Kind of work -> the tier name that answers it outright, e.g. ``{"structured": "cheap"}``."""
    tools: bool = False
    """Tool calls run the cascade too (escalating on the entropy of the call they write)."""
    structured: bool = False
    """Structured-output calls run the cascade too."""

    @field_validator("direct_below")
    @classmethod
    def _nats(cls, value: float | str) -> float | str:
        if value != "profile":
            bounded("direct_below", value, 0, MAX_NATS)
        return value


class Tier(BaseModel):
    """One tier of a cascade: a model on any backend, and how it runs. Fields left unset are the chat model's;
    setting any of ``model``, ``base_url``, ``backend`` gives the tier its own engine (and ``api_key``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_TEXT)
    model: str | None = None
    """A local model folder, or a server's served model name with ``base_url``."""
    base_url: str | list[str] | None = None
    api_key: SecretStr | None = None
    backend: Any = Field(default=None, exclude=True)
    """A ready Backend."""
    gravity: GravityConfig | None = None
    """This tier's gravity (e.g. a smaller ``max_reasoning_tokens`` for a cheap tier); None: the chat model's."""
    compute: ComputeConfig | None = None
    """Cheaper zone tokens on this tier (transformers backend), e.g. ``ComputeConfig(speculate=None,
    skip=LayerSkipConfig(layers="profile"))`` for a layer-skipped cheap tier."""
    max_model_len: int | None = Field(None, ge=16)

    ENGINE_FIELDS: ClassVar[frozenset[str]] = frozenset({"model", "base_url", "api_key", "backend"})

    def overrides(self) -> dict[str, Any]:
        """The chat-model fields this tier sets."""
        return {k: getattr(self, k) for k in self.model_fields_set - {"name"}}


CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SPANS_ENV = "AGENT_GRAVITY_SPANS"
_CONTENT_ON = {"true", "1", "span_only", "span_and_event"}
_CONTENT_OFF = {"", "false", "0", "no_content", "event_only"}


def _content_from_env() -> bool:
    value = os.environ.get(CONTENT_ENV, "").strip().lower()
    if value not in _CONTENT_ON | _CONTENT_OFF:
        raise ValueError(f"{CONTENT_ENV}={value!r} is not understood; set it to true or false")
    return value in _CONTENT_ON


class TelemetryConfig(BaseModel):
    """What agent-gravity records about each call: spans, message content, and the entropy trace file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spans: Literal["own", "enrich", "off"] = Field(default_factory=lambda: os.environ.get(SPANS_ENV, "own"))
    """``own``: a ``chat``/``invoke_agent``/``execute_tool`` span of ours under the caller's active span;
    ``enrich``: no span of ours, our attributes and events go on the caller's active span (for users who
    already run a LangChain instrumentor); ``off``: no spans. Default: ``$AGENT_GRAVITY_SPANS`` or ``own``.
    Metrics are recorded in every mode."""
    capture_content: bool = Field(default_factory=_content_from_env)
    """Record prompt and completion text on spans (``gen_ai.input.messages``, ``gen_ai.output.messages``).
    Off unless set, or unless ``$OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is true."""
    trace_file: Path | None = None
    """Append each call's entropy trace to this JSONL file (read by ``agent-gravity report``)."""
