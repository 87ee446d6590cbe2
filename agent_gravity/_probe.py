"""Probe-confirmed exit: a short side-branch answer, asked when a policy says "locked" (or on a schedule).

The engine runs a probe as its own greedy request on the prompt, the reasoning so far and
the end-of-reasoning marker, so the prefix cache serves almost all of it and the main
generation goes on untouched. The exit happens only when consecutive probes agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from agent_gravity.policies import Lock

HESITATION = re.compile(r"\b(wait|hmm|maybe|perhaps|not sure|unsure|let me|however)\b|\?")
"""Words that say a probe answer is not settled, as in Dynasor-CoT's certainty check."""


@dataclass(frozen=True)
class ProbeSpec:
    """When and how the engine probes a request's answer."""

    agree: int = 2
    """Consecutive probe answers that must agree before the exit."""
    tokens: int = 10
    """Tokens each probe may write."""
    gap: int = 8
    """Reasoning tokens between the starts of two probes."""
    max_probes: int = 6
    interval: int | None = None
    """Also probe every ``interval`` tokens whatever the policy says (Dynasor-CoT's schedule); None: on locks only."""

    def __post_init__(self) -> None:
        for name in ("agree", "tokens", "gap", "max_probes"):
            if getattr(self, name) < 1:
                raise ValueError(f"probe.{name} must be >= 1, got {getattr(self, name)}")
        if self.interval is not None and self.interval < 1:
            raise ValueError(f"probe.interval must be >= 1 or None, got {self.interval}")


def answer_key(text: str) -> str:
    """The comparable form of a probe answer: first line, lower case, no edge punctuation; '' if hesitant."""
    first = text.strip().split("\n", 1)[0].strip().lower()
    first = first.strip(" .!,;:*\"'`")
    return "" if HESITATION.search(first) else first


Prober = Callable[[list[int]], None]
"""Submits a probe for the given generated ids (reasoning so far plus the marker); set by the backend."""


@dataclass
class ProbeRecord:
    """One probe: where it started, what it answered."""

    step: int
    trigger: Lock | None = None
    """The policy lock that asked for this probe; None for a scheduled one."""
    answer: str | None = None
    tokens: int = 0


@dataclass
class ProbeState:
    """A request's probes and whether the last ``agree`` of them confirm an exit."""

    spec: ProbeSpec
    records: list[ProbeRecord] = field(default_factory=list)

    @property
    def in_flight(self) -> bool:
        return bool(self.records) and self.records[-1].answer is None

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.records)

    def may_start(self, step: int) -> bool:
        """A new probe may start at ``step``: none in flight, the gap since the last one passed, budget left."""
        if self.in_flight or len(self.records) >= self.spec.max_probes:
            return False
        return not self.records or step - self.records[-1].step >= self.spec.gap

    def start(self, step: int, trigger: Lock | None) -> None:
        self.records.append(ProbeRecord(step, trigger))

    def answered(self, text: str, tokens: int) -> bool:
        """Record the in-flight probe's answer; True when the last ``agree`` answers now agree."""
        record = self.records[-1]
        record.answer, record.tokens = answer_key(text), tokens
        last = [r.answer for r in self.records[-self.spec.agree:]]
        return len(last) == self.spec.agree and bool(last[0]) and len(set(last)) == 1
