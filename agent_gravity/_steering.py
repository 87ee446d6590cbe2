"""Action: the per-request state machine that ends converged reasoning inside the engine.

A backend's logits hook calls :meth:`Steering.step` once per decode step with the exact
entropy (and varentropy) of the distribution about to be sampled. The state machine records
the trace, feeds confirmed tokens to the gravity and loop policies, starts answer probes
through the backend when a lock needs confirming, and answers with what to do to this step's
logits: force the next token of the end-of-reasoning text, force end of sequence after a loop,
ban end of sequence, or move end-of-sequence mass onto the end-of-reasoning token.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from agent_gravity._limits import MAX_IDS, MAX_MARKER_IDS, MAX_TEXT, MAX_TOKENS, bounded
from agent_gravity._probe import Prober, ProbeSpec, ProbeState
from agent_gravity.policies import GravityPolicy, Lock, Observation, policy_from_spec

EXTRA_ARGS_KEY = "agent_gravity"
LINE_WAIT = 16
"""Reasoning tokens a probe-confirmed exit waits for a line start before it closes mid-line (a line break first,
as the budget does): rambles that write one long line (a list, a run of numbers) had kept confirmed exits waiting
until the cap."""
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReasoningIds:
    """Token ids of a reasoning format, as the engine sees them."""

    end_ids: tuple[int, ...]
    """The end-of-reasoning marker as forced; end-of-sequence mass moves onto its first id."""
    end_start_ids: tuple[int, ...]
    """Ids that begin the marker as the model may write it (``</``, `` </``...): sampling one closes reasoning."""
    answer_prefix_ids: tuple[int, ...]
    """Forced after the marker, so the answer starts where the caller can find it."""
    line_break_ids: tuple[int, ...]
    """Ids whose text ends a line: gravity closes reasoning only at such a boundary."""
    newline_ids: tuple[int, ...]
    """Forced before the marker when the reasoning budget closes it mid-line."""
    max_reasoning_tokens: int


@dataclass(frozen=True)
class SteeringSpec:
    """Per-request settings; travels as plain data in ``SamplingParams.extra_args``."""

    key: str
    eos_ids: tuple[int, ...]
    policy: dict[str, Any] | None = None
    """``{"name": ..., **params}`` deciding when reasoning has converged; None never fires."""
    loop: dict[str, Any] | None = None
    """Policy spec for degenerate loops, watched in every phase; None never stops a loop."""
    probe: ProbeSpec | None = None
    """Confirm gravity locks with answer probes; None exits on the policy's word alone."""
    min_tokens: int = 0
    reasoning: ReasoningIds | None = None
    brackets: tuple[tuple[int, int], ...] = ()
    """``(id, opened minus closed brackets)`` for ids that open or close JSON: no exit fires inside."""
    structured: bool = False
    """Tool calls or grammar-constrained output: nothing is ever cut, the trace is still recorded."""
    guard_ids: tuple[int, ...] = ()
    """Ids that may open a tool call: once one is sampled, nothing is cut for the rest of the output."""

    def to_dict(self) -> dict[str, Any]:
        """Serialise to JSON-compatible data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SteeringSpec:
        """Parse and validate; raises ValueError naming the bad field."""
        try:
            spec = cls(
                key=_text("key", data["key"]),
                eos_ids=_ids("eos_ids", data["eos_ids"], MAX_MARKER_IDS),
                policy=_policy(data.get("policy")),
                loop=_policy(data.get("loop")),
                probe=None if data.get("probe") is None else ProbeSpec(**data["probe"]),
                min_tokens=_count("min_tokens", data.get("min_tokens", 0)),
                reasoning=_reasoning(data.get("reasoning")),
                brackets=tuple((int(i), int(d)) for i, d in _bounded_list("brackets", data.get("brackets", ()),
                                                                          MAX_IDS)),
                structured=bool(data.get("structured", False)),
                guard_ids=_ids("guard_ids", data.get("guard_ids", ()), MAX_IDS),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: {exc!r}") from exc
        if spec.reasoning is not None and not (
            spec.reasoning.end_ids and spec.reasoning.newline_ids
            and spec.reasoning.end_ids[0] in spec.reasoning.end_start_ids
        ):
            raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: reasoning.end_ids and newline_ids must be set, "
                             "and end_start_ids must hold end_ids[0]")
        return spec


def _policy(data: Any) -> dict[str, Any] | None:
    if data is None:
        return None
    policy_from_spec(data)  # raises on unknown names or bad parameters
    return dict(data)


def _reasoning(data: Any) -> ReasoningIds | None:
    if data is None:
        return None
    return ReasoningIds(
        **{name: _ids(f"reasoning.{name}", data[name], MAX_MARKER_IDS)
           for name in ("end_ids", "end_start_ids", "answer_prefix_ids", "line_break_ids", "newline_ids")},
        max_reasoning_tokens=_count("reasoning.max_reasoning_tokens", data["max_reasoning_tokens"]),
    )


def _bounded_list(name: str, data: Any, most: int) -> list[Any]:
    if not isinstance(data, list | tuple) or len(data) > most:
        raise ValueError(f"{name} must be a list of at most {most} items")
    return list(data)


def _ids(name: str, data: Any, most: int) -> tuple[int, ...]:
    return tuple(int(i) for i in _bounded_list(name, data, most))


def _count(name: str, value: Any) -> int:
    bounded(name, value, 0, MAX_TOKENS)
    return int(value)


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{name} must be a string of at most {MAX_TEXT} characters")
    return value


class Phase(Enum):
    PLAIN = "plain"
    REASONING = "reasoning"
    CLOSING = "closing"
    ANSWER = "answer"
    STOPPED = "stopped"


class Exit(Enum):
    """How the reasoning phase ended."""

    MODEL = "model_ended"
    GRAVITY = "gravity"
    LOOP = "loop"
    BUDGET = "reasoning_budget"


@dataclass(frozen=True)
class Action:
    """What to do to one row of logits before sampling."""

    force: int | None = None
    ban: tuple[int, ...] = ()
    merge_into: int | None = None
    """Move the probability mass of the banned ids onto this id."""


NO_ACTION = Action()


@dataclass
class Steering:
    """Per-request gravity state machine; the engine drives it, the caller reads its trace.

    ``prober`` is set by an in-process backend that can run answer probes; without one a
    probe-confirmed policy never exits early (it cannot be confirmed).
    """

    spec: SteeringSpec
    prober: Prober | None = None
    entropy: list[float] = field(default_factory=list)
    varentropy: list[float] = field(default_factory=list)
    lock: Lock | None = None
    """The lock that ended reasoning or stopped a loop (or, with no exit, the first one seen)."""
    exit: Exit | None = None
    stopped: Lock | None = None
    """A loop lock that ended the output after the reasoning (or in plain generation)."""
    reasoning_tokens: int | None = None
    answer_start: int | None = None
    probes: ProbeState | None = field(init=False, default=None)
    _policy: GravityPolicy | None = field(init=False, default=None)
    _loop: GravityPolicy | None = field(init=False, default=None)
    _candidate: Lock | None = field(init=False, default=None)
    _confirmed_lock: Lock | None = field(init=False, default=None)
    _confirmed_at: int = field(init=False, default=0)
    _loop_lock: Lock | None = field(init=False, default=None)
    _phase: Phase = field(init=False)
    _pending: list[int] = field(init=False, default_factory=list)
    _confirmed: int = field(init=False, default=0)
    _answer_has_text: bool = field(init=False, default=False)
    _depth: int = field(init=False, default=0)
    _brackets: dict[int, int] = field(init=False, default_factory=dict)
    _guards: frozenset[int] = field(init=False, default=frozenset())
    _guarded: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        spec = self.spec
        self._policy = policy_from_spec(spec.policy) if spec.policy is not None else None
        self._loop = policy_from_spec(spec.loop) if spec.loop is not None else None
        self.probes = ProbeState(spec.probe) if spec.probe is not None else None
        self._brackets = dict(spec.brackets)
        self._guards = frozenset(spec.guard_ids)
        self._phase = Phase.REASONING if spec.reasoning else Phase.PLAIN

    @classmethod
    def follower(cls, spec: SteeringSpec) -> Steering:
        """A state machine that follows the phases of an output an engine steered with ``spec``, deciding no exit
        but the reasoning budget (which the engine closes at the same token)."""
        steering = cls(spec)
        steering._policy = steering._loop = steering.probes = None
        return steering

    @property
    def terminated_early(self) -> bool:
        return self.exit in (Exit.GRAVITY, Exit.LOOP) or self.stopped is not None

    @property
    def reason(self) -> str | None:
        """Why the output ended where it did: an Exit value, or ``loop`` for a stopped loop."""
        return "loop" if self.stopped is not None else self.exit.value if self.exit else None

    def step(self, entropy: float, output_ids: list[int], top_id: int | None = None,
             varentropy: float = math.nan) -> Action:
        """Record this step's entropy, confirm the tokens sampled since, and decide.

        ``top_id`` is the model's most likely next token: when gravity fires where the model
        was about to close its reasoning anyway, the exit is credited to the model.
        """
        t = len(output_ids)
        self._record(t, entropy, varentropy)
        for s in range(self._confirmed, t):
            self._on_token(s, output_ids[s])
        self._confirmed = max(self._confirmed, t)
        return self._decide(t, output_ids, top_id)

    def probe_answered(self, text: str, tokens: int, confidence: float | None = None) -> None:
        """The in-flight probe wrote ``text`` in ``tokens`` tokens, none less likely than ``confidence`` (called on
        the engine's thread)."""
        if self.probes is None or not self.probes.in_flight:
            return
        if self.probes.answered(text, tokens, confidence) and self._phase is Phase.REASONING:
            run = self.probes.agreeing()
            first, trigger = run[0], run[0].trigger
            values = {**(trigger.values if trigger else {}), "probes": float(len(self.probes.records)),
                      "agreeing": float(len(run))}
            name = f"probe({trigger.policy})" if trigger else "probe"
            self._confirmed_lock, self._confirmed_at = Lock(first.step, name, values), self._confirmed

    def _record(self, t: int, entropy: float, varentropy: float) -> None:
        # A step whose sample the engine discarded (chunked prefill) is seen again at the same t.
        for trace, value in ((self.entropy, entropy), (self.varentropy, varentropy)):
            del trace[t:]
            trace.extend([math.nan] * (t - len(trace)))
            trace.append(value)

    def _on_token(self, s: int, token: int) -> None:
        reasoning = self.spec.reasoning
        self._depth = max(0, self._depth + self._brackets.get(token, 0))
        self._guarded |= token in self._guards
        if self._phase is Phase.CLOSING:
            self._pending.pop(0)
            if not self._pending:
                self._begin_answer(s + 1)
        elif self._phase is Phase.REASONING and reasoning and token in reasoning.end_start_ids:
            self._close(s, Exit.MODEL, [*reasoning.end_ids[1:], *reasoning.answer_prefix_ids])
            if not self._pending:
                self._begin_answer(s + 1)
        else:
            self._observe(s, token)

    def _observe(self, s: int, token: int) -> None:
        obs = Observation(s, token, self.entropy[s], self.varentropy[s])
        early = s + 1 < self.spec.min_tokens
        loop = self._loop.observe(obs) if self._loop is not None else None
        lock = None
        if self._phase is Phase.ANSWER:
            if reasoning := self.spec.reasoning:
                self._answer_has_text |= token not in reasoning.line_break_ids
        elif self._policy is not None:
            lock = self._policy.observe(obs)
            if lock is not None and lock.reason == "loop":  # a composed policy that saw a loop
                loop, lock = loop or lock, None
        # Locks are levels: each token's verdict replaces the last, so a lock that has passed acts no more.
        self._candidate = None if early else lock
        self._loop_lock = None if early else loop
        if self.lock is None and self._phase is not Phase.ANSWER:
            self.lock = self._candidate

    def _may_cut(self) -> bool:
        """No early exit under structured output, after a tool call may have opened, nor inside an open
        bracket of the output the caller parses.

        Reasoning is never parsed, so a bracket left open there (``[0, 1)``) blocks nothing.
        """
        return (not self.spec.structured and not self._guarded
                and (self._phase is Phase.REASONING or self._depth == 0))

    def _decide(self, t: int, output_ids: list[int], top_id: int | None) -> Action:
        if self._phase is Phase.REASONING:
            self._decide_reasoning(t, output_ids, top_id)
        if self._phase is Phase.CLOSING:
            return Action(force=self._pending[0])
        answer_may_stop = self._phase is Phase.PLAIN or (self._phase is Phase.ANSWER and self._answer_has_text)
        if answer_may_stop and self._loop_lock is not None and self._may_cut():
            self.stopped, self._phase = self._loop_lock, Phase.STOPPED
        if self._phase is Phase.STOPPED:
            return Action(force=self.spec.eos_ids[0])
        if self._phase is Phase.ANSWER and not self._answer_has_text:
            return Action(ban=self.spec.eos_ids)  # an answer is never empty
        if self._phase is Phase.REASONING:
            assert self.spec.reasoning is not None
            return Action(ban=self.spec.eos_ids, merge_into=self.spec.reasoning.end_ids[0])
        return NO_ACTION

    def _decide_reasoning(self, t: int, output_ids: list[int], top_id: int | None) -> None:
        reasoning = self.spec.reasoning
        assert reasoning is not None
        marker = [*reasoning.end_ids, *reasoning.answer_prefix_ids]
        at_line_start = not output_ids or output_ids[-1] in reasoning.line_break_ids
        mid_line = [] if at_line_start else list(reasoning.newline_ids)
        if self._loop_lock is not None and self._may_cut():
            self.lock = self._loop_lock
            self._close(t, Exit.LOOP, [*mid_line, *marker])
        elif (exit_lock := self._exit_lock()) is not None and (at_line_start or self._waited(t)) and self._may_cut():
            self.lock = exit_lock
            closing_anyway = top_id == reasoning.end_ids[0] or top_id in self.spec.eos_ids
            self._close(t, Exit.MODEL if closing_anyway else Exit.GRAVITY, [*mid_line, *marker])
        elif t >= reasoning.max_reasoning_tokens:
            self._close(t, Exit.BUDGET, [*mid_line, *marker])
        elif self._wants_probe(t) and self._may_cut():
            self._start_probe(t, [*output_ids, *mid_line, *marker])

    def _start_probe(self, t: int, ids: list[int]) -> None:
        assert self.probes is not None and self.prober is not None
        self.probes.start(t, self._candidate)
        try:
            self.prober(ids)
        except Exception:  # noqa: BLE001 - this runs inside the engine's step: a probe that cannot start confirms nothing
            _log.warning("an answer probe could not start; reasoning goes on", exc_info=True)
            self.probes.answered("", 0)

    def _waited(self, t: int) -> bool:
        """A confirmed exit has waited ``LINE_WAIT`` tokens for a line start."""
        return self._confirmed_lock is not None and t - self._confirmed_at >= LINE_WAIT

    def _exit_lock(self) -> Lock | None:
        """The lock that may end reasoning now: the policy's own, or one the probes confirmed."""
        return self._confirmed_lock if self.probes is not None else self._candidate

    def _wants_probe(self, t: int) -> bool:
        probes = self.probes
        if probes is None or self.prober is None or self._confirmed_lock is not None:
            return False
        if t < max(1, self.spec.min_tokens) or not probes.may_start(t):
            return False
        interval = probes.spec.interval
        return self._candidate is not None or (interval is not None and t % interval == 0)

    def _close(self, t: int, how: Exit, pending: list[int]) -> None:
        self.exit, self.reasoning_tokens, self._pending = how, t, pending
        self._phase, self._depth = Phase.CLOSING, 0
        if self.spec.loop is not None:  # the answer is watched for loops of its own, from scratch
            self._loop, self._loop_lock = policy_from_spec(self.spec.loop), None

    def _begin_answer(self, t: int) -> None:
        self._phase, self.answer_start = Phase.ANSWER, t
