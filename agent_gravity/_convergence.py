"""Detection across agent steps: has the agent converged, or is it a runaway loop?

One step is one model call and the tool calls it asked for. The agent has converged when
successive steps give the same interim answer, when it repeats a tool call with the same
arguments, or (when asked for) when the model's peak entropy stays low for several steps. A loop
that reaches ``max_steps`` without converging is stopped as a runaway. Framework-free: the
LangChain middleware and the loop decorator both drive it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from pydantic import BaseModel, ConfigDict, Field

_SPACE = re.compile(r"\s+")


class ConvergenceConfig(BaseModel):
    """When an agent loop counts as converged, and when it is a runaway."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    same_answer: int | None = Field(2, ge=2)
    """End after this many successive steps give the same interim answer; None never does."""
    repeated_call: int | None = Field(2, ge=2)
    """End when the same tool call (name and arguments) has been asked for this many times; None never does."""
    low_entropy_steps: int | None = Field(None, ge=1)
    """End after this many successive steps whose peak entropy stays under ``entropy_threshold``; None
    (the default) never does. A model that is sure of every token for several steps has locked in, but
    a capable agent is also sure while it makes progress, so this is off unless asked for
    (``agent-gravity bench agents --low-entropy-steps K`` measures what it costs)."""
    entropy_threshold: float = Field(0.5, ge=0.0, allow_inf_nan=False)
    """Nats: a step's peak next-token entropy (its most uncertain choice) below this counts as sure."""
    max_steps: int = Field(12, ge=1)
    """The loop guard: a loop that has not converged after this many steps is stopped as a runaway."""


@dataclass(frozen=True)
class Step:
    """What one agent step produced."""

    answer: str
    """The step's text (its interim answer); empty for a bare tool call."""
    calls: tuple[str, ...] = ()
    """Each tool call as canonical ``name(arguments JSON)``."""
    entropy: float = math.nan
    """Peak next-token entropy of the step's output (its most uncertain choice); NaN when none was reported."""

    @classmethod
    def of_message(cls, message: AIMessage) -> Step:
        """The step a chat model's reply represents (ChatGravity's metadata gives the entropy trace)."""
        calls = tuple(canonical_call(c["name"], c["args"]) for c in message.tool_calls)
        trace = ((message.response_metadata or {}).get("gravity") or {}).get("entropy") or []
        finite = [e for e in trace if math.isfinite(e)]
        return cls(message.text.strip(), calls, max(finite) if finite else math.nan)


def canonical_call(name: str, args: dict[str, Any]) -> str:
    """A tool call as one comparable string: arguments in key order, compact JSON."""
    return f"{name}({json.dumps(args, sort_keys=True, separators=(',', ':'), ensure_ascii=False)})"


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower().rstrip(".")


@dataclass(frozen=True)
class Verdict:
    """Why the loop ends now, and the best answer it has."""

    reason: str
    """``same_answer``, ``repeated_tool_call``, ``low_entropy`` or ``max_steps`` (a runaway loop)."""
    step: int
    answer: str
    detail: str

    @property
    def converged(self) -> bool:
        return self.reason != "max_steps"


@dataclass
class ConvergenceTracker:
    """Feed it every step; it says when the loop should end."""

    config: ConvergenceConfig = field(default_factory=ConvergenceConfig)
    steps: list[Step] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    """Tool results seen so far, oldest first: the best answer when the model never wrote one."""

    def observe(self, step: Step) -> Verdict | None:
        """Record ``step``; return a Verdict when the loop should end after it.

        A step that asks for no tool call ends the loop by itself: it is recorded, never judged.
        """
        self.steps.append(step)
        if not step.calls:
            return None
        n, cfg = len(self.steps), self.config
        if cfg.same_answer and (verdict := self._same_answer(cfg.same_answer)):
            return verdict
        if cfg.repeated_call and (verdict := self._repeated_call(cfg.repeated_call)):
            return verdict
        if cfg.low_entropy_steps and n >= cfg.low_entropy_steps:
            recent = [s.entropy for s in self.steps[-cfg.low_entropy_steps:]]
            if all(e < cfg.entropy_threshold for e in recent):  # NaN compares False: no trace, no verdict
                return self._verdict("low_entropy", f"peak entropy under {cfg.entropy_threshold} nats for "
                                                    f"{cfg.low_entropy_steps} steps (last {recent[-1]:.3f})")
        if n >= cfg.max_steps:
            return self.runaway()
        return None

    def tool_result(self, message: ToolMessage) -> None:
        """Record a tool's result; a failed tool gives no answer."""
        if message.status != "error" and message.text.strip():
            self.results.append(message.text.strip())

    def runaway(self) -> Verdict:
        """The verdict for a loop that reached ``max_steps`` without converging."""
        return self._verdict("max_steps", f"no convergence after {len(self.steps)} steps; stopped as a runaway loop")

    def best_answer(self) -> str:
        """The latest interim answer the model wrote, else the latest tool result, else empty."""
        for step in reversed(self.steps):
            if step.answer:
                return step.answer
        return self.results[-1] if self.results else ""

    def _same_answer(self, k: int) -> Verdict | None:
        recent = [_norm(s.answer) for s in self.steps[-k:]]
        if len(recent) == k and recent[0] and len(set(recent)) == 1:
            return self._verdict("same_answer", f"the last {k} steps gave the same answer")
        return None

    def _repeated_call(self, k: int) -> Verdict | None:
        last = self.steps[-1].calls
        seen = [c for s in self.steps for c in s.calls]
        for call in last:
            if seen.count(call) >= k:
                return self._verdict("repeated_tool_call", f"{call} was asked for {seen.count(call)} times")
        return None

    def _verdict(self, reason: str, detail: str) -> Verdict:
        return Verdict(reason, len(self.steps), self.best_answer(), detail)


def steps_saved(verdict: Verdict | None, steps: int, max_steps: int) -> int:
    """Steps the loop budget still held when a converged loop ended (0 when it was not cut)."""
    return max(0, max_steps - steps) if verdict is not None and verdict.converged else 0

