"""Probe-confirmed exit: a short side-branch answer, asked when a policy says "locked" (or on a schedule).

The engine runs a probe as its own greedy request on the prompt, the reasoning so far and
the end-of-reasoning marker, so the prefix cache serves almost all of it and the main
generation goes on untouched. The exit happens only when consecutive probes agree.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent_gravity._limits import MAX_PROBE_TOKENS, MAX_PROBES, MAX_TOKENS, bounded
from agent_gravity.policies import Lock

_log = logging.getLogger(__name__)
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
    min_confidence: float | None = None
    """A probe answer counts only if every token of it had at least this probability (a least-token variant of
    DEER's trial-answer confidence); None: any answer counts."""
    lenient_after: int | None = None
    """Probes started at or after this reasoning step skip the confidence test: reasoning that long is a ramble
    whose answer a full run leaves to chance anyway; None: the test always applies."""
    hold: int | None = None
    """Reasoning tokens an answer must hold before it confirms an exit before ``lenient_after``: the first of the
    agreeing probes started at least this many tokens before the last; None: ``agree`` probes suffice."""

    def __post_init__(self) -> None:
        for name, high in PROBE_LIMITS.items():
            if (value := getattr(self, name)) is not None or name not in _OPTIONAL:
                bounded(f"probe.{name}", value, 1, high)
        if self.min_confidence is not None:
            bounded("probe.min_confidence", self.min_confidence, 0, 1, above=True)


PROBE_LIMITS = {"agree": MAX_PROBES, "tokens": MAX_PROBE_TOKENS, "gap": MAX_TOKENS, "max_probes": MAX_PROBES,
                "interval": MAX_TOKENS, "lenient_after": MAX_TOKENS, "hold": MAX_TOKENS}
"""The upper bound of each count in a probe spec (each is at least 1)."""
_OPTIONAL = frozenset({"interval", "lenient_after", "hold"})


def answer_key(text: str) -> str:
    """The comparable form of a probe answer: first line, lower case, no edge punctuation; '' if hesitant."""
    first = text.strip().split("\n", 1)[0].strip().lower()
    first = first.strip(" .!,;:*\"'`")
    return "" if HESITATION.search(first) else first


def line_confidence(texts: Sequence[str], probs: Sequence[float]) -> float | None:
    """The lowest probability among a probe's tokens up to the one that ends its first line; None for none.

    ``texts`` are the tokens' texts and ``probs`` the probabilities they were chosen with.
    """
    kept = []
    for text, p in zip(texts, probs):
        if text.startswith("\n"):
            break
        kept.append(p)
        if "\n" in text:
            break
    return min(kept, default=None)


@functools.cache
def _warn_unmeasured() -> None:
    _log.warning("a probe answer came without its token probabilities, so under probe.min_confidence it confirms "
                 "nothing (before probe.lenient_after); use a backend that reports them or set min_confidence=None")


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
    confidence: float | None = None
    """The lowest probability among the answer's tokens; None when the backend did not measure it."""


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

    def _lenient(self, record: ProbeRecord) -> bool:
        return self.spec.lenient_after is not None and record.step >= self.spec.lenient_after

    def _unsure(self, record: ProbeRecord) -> bool:
        if self.spec.min_confidence is None or self._lenient(record):
            return False
        if record.confidence is None and record.answer:
            _warn_unmeasured()
        return record.confidence is None or record.confidence < self.spec.min_confidence

    def agreeing(self) -> list[ProbeRecord]:
        """The latest probes that gave one settled answer, oldest first; empty when the last was hesitant."""
        run: list[ProbeRecord] = []
        for r in reversed(self.records):
            if not r.answer or (run and r.answer != run[0].answer):
                break
            run.insert(0, r)
        return run

    def answered(self, text: str, tokens: int, confidence: float | None = None) -> bool:
        """Record the in-flight probe's answer; True when the last ``agree`` answers now agree.

        Under ``min_confidence`` an answer whose confidence is lower, or was not measured, counts as hesitant
        (unless the probe started at or after ``lenient_after``); under ``hold`` the agreeing probes must also span
        that many reasoning tokens (unless the last started at or after ``lenient_after``).
        """
        record = self.records[-1]
        record.answer, record.tokens, record.confidence = answer_key(text), tokens, confidence
        if self._unsure(record):
            record.answer = ""
        run = self.agreeing()
        if len(run) < self.spec.agree:
            return False
        return self.spec.hold is None or self._lenient(record) or record.step - run[0].step >= self.spec.hold
