"""Action: the per-request state machine that ends converged reasoning inside the engine.

A backend's logits hook calls :meth:`Steering.step` once per decode step with the exact
entropy of the distribution about to be sampled. The state machine records the trace,
feeds confirmed reasoning tokens to the gravity policy, and answers with what to do to
this step's logits: force the next token of the end-of-reasoning text, ban end of
sequence, or move end-of-sequence mass onto the end-of-reasoning token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from agent_gravity.policies import GravityPolicy, Lock, policy_from_spec

EXTRA_ARGS_KEY = "agent_gravity"


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
    """``{"name": ..., **params}``; None records the trace but never fires."""
    min_tokens: int = 0
    reasoning: ReasoningIds | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialise to JSON-compatible data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SteeringSpec:
        """Parse and validate; raises ValueError naming the bad field."""
        try:
            reasoning = data.get("reasoning")
            spec = cls(
                key=str(data["key"]),
                eos_ids=tuple(int(i) for i in data["eos_ids"]),
                policy=dict(data["policy"]) if data.get("policy") is not None else None,
                min_tokens=int(data.get("min_tokens", 0)),
                reasoning=None if reasoning is None else ReasoningIds(
                    **{name: tuple(int(i) for i in reasoning[name])
                       for name in ("end_ids", "end_start_ids", "answer_prefix_ids", "line_break_ids",
                                    "newline_ids")},
                    max_reasoning_tokens=int(reasoning["max_reasoning_tokens"]),
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: {exc!r}") from exc
        if spec.reasoning is not None and not (
            spec.reasoning.end_ids and spec.reasoning.newline_ids and spec.reasoning.end_ids[0] in spec.reasoning.end_start_ids
        ):
            raise ValueError(f"invalid {EXTRA_ARGS_KEY} settings: reasoning.end_ids and newline_ids must be set, "
                             "and end_start_ids must hold end_ids[0]")
        if spec.policy is not None:
            policy_from_spec(spec.policy)  # raises on unknown names or bad parameters
        return spec


class Phase(Enum):
    PLAIN = "plain"
    REASONING = "reasoning"
    CLOSING = "closing"
    ANSWER = "answer"


class Exit(Enum):
    """How the reasoning phase ended."""

    MODEL = "model_ended"
    GRAVITY = "gravity"
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
    """Per-request gravity state machine; the engine drives it, the caller reads its trace."""

    spec: SteeringSpec
    entropy: list[float] = field(default_factory=list)
    lock: Lock | None = None
    exit: Exit | None = None
    reasoning_tokens: int | None = None
    answer_start: int | None = None
    _policy: GravityPolicy | None = field(init=False, default=None)
    _phase: Phase = field(init=False)
    _pending: list[int] = field(init=False, default_factory=list)
    _confirmed: int = field(init=False, default=0)
    _answer_has_text: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.spec.policy is not None:
            self._policy = policy_from_spec(self.spec.policy)
        self._phase = Phase.REASONING if self.spec.reasoning else Phase.PLAIN

    @property
    def terminated_early(self) -> bool:
        return self.exit is Exit.GRAVITY

    def step(self, entropy: float, output_ids: list[int], top_id: int | None = None) -> Action:
        """Record this step's entropy, confirm the tokens sampled since, and decide.

        ``top_id`` is the model's most likely next token: when gravity fires where the model
        was about to close its reasoning anyway, the exit is credited to the model.
        """
        t = len(output_ids)
        self._record(t, entropy)
        for s in range(self._confirmed, t):
            self._on_token(s, output_ids[s])
        self._confirmed = max(self._confirmed, t)
        return self._decide(t, output_ids[t - 1] if t else None, top_id)

    def _record(self, t: int, entropy: float) -> None:
        # A step whose sample the engine discarded (chunked prefill) is seen again at the same t.
        del self.entropy[t:]
        self.entropy.extend([math.nan] * (t - len(self.entropy)))
        self.entropy.append(entropy)

    def _on_token(self, s: int, token: int) -> None:
        reasoning = self.spec.reasoning
        if self._phase is Phase.CLOSING:
            self._pending.pop(0)
            if not self._pending:
                self._begin_answer(s + 1)
        elif self._phase is Phase.REASONING and reasoning and token in reasoning.end_start_ids:
            self._close(s, Exit.MODEL, [*reasoning.end_ids[1:], *reasoning.answer_prefix_ids])
            if not self._pending:
                self._begin_answer(s + 1)
        elif self._phase in (Phase.REASONING, Phase.PLAIN):
            self._observe(s)
        elif self._phase is Phase.ANSWER and reasoning and token not in reasoning.line_break_ids:
            self._answer_has_text = True

    def _observe(self, s: int) -> None:
        if self._policy is None or self.lock is not None:
            return
        lock = self._policy.observe(s, self.entropy[s])
        if lock is not None and s + 1 >= self.spec.min_tokens:
            self.lock = lock

    def _decide(self, t: int, last: int | None, top_id: int | None) -> Action:
        reasoning = self.spec.reasoning
        if self._phase is Phase.REASONING:
            assert reasoning is not None
            marker = [*reasoning.end_ids, *reasoning.answer_prefix_ids]
            at_line_start = last is None or last in reasoning.line_break_ids
            if self.lock is not None and at_line_start:
                closing_anyway = top_id == reasoning.end_ids[0] or top_id in self.spec.eos_ids
                self._close(t, Exit.MODEL if closing_anyway else Exit.GRAVITY, marker)
            elif t >= reasoning.max_reasoning_tokens:
                self._close(t, Exit.BUDGET, marker if at_line_start else [*reasoning.newline_ids, *marker])
            else:
                return Action(ban=self.spec.eos_ids, merge_into=reasoning.end_ids[0])
        if self._phase is Phase.CLOSING:
            return Action(force=self._pending[0])
        if self._phase is Phase.ANSWER and not self._answer_has_text:
            return Action(ban=self.spec.eos_ids)  # an answer is never empty
        return NO_ACTION

    def _close(self, t: int, how: Exit, pending: list[int]) -> None:
        self.exit, self.reasoning_tokens, self._pending = how, t, pending
        self._phase = Phase.CLOSING

    def _begin_answer(self, t: int) -> None:
        self._phase, self.answer_start = Phase.ANSWER, t
