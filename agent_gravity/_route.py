"""Routing by entropy: answer without reasoning when a direct answer is sure, and escalate a cheap tier's unsure
output to the next tier.

Both decisions read the exact per-token entropy the engine reports. The direct-answer gate reads the first line
of an answer written with an empty reasoning (the answer prefix right after the prompt, so the prefix cache
serves it) and passes only when every token of it was nearly certain. Escalation reads a finished output's
entropy *quantile* (not its mean: a confident output with one unsure token is the case a mean hides, as
token-level deferral work recommends) and whether the tier's answer probes had settled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_gravity.backends.base import GenerationDelta, GenerationResult, StreamItem

DIRECT = "direct"
REASON = "reason"


def entropy_quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation) of the finite entropies; None when there are none."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.quantile(finite, q)) if finite else None


@dataclass
class DirectGate:
    """Holds a direct answer's first stream items until its first line is read, then says whether the model is
    sure of it: every token up to the end of that line (at most ``tokens`` of them) had entropy <= ``below``."""

    below: float
    tokens: int
    decode: Callable[[Sequence[int]], str]
    held: list[StreamItem] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    text: str = ""
    verdict: bool | None = None

    @property
    def score(self) -> float | None:
        """The largest entropy read (nats); None before any token."""
        return max((e for e in self.entropy if math.isfinite(e)), default=None)

    def feed(self, item: StreamItem) -> bool | None:
        """Take the next stream item; the verdict once the first line is read (True: answer directly), else None."""
        self.held.append(item)
        if isinstance(item, GenerationResult) and self.entropy:
            return self._decide()
        for token, entropy in zip(item.token_ids, item.entropy):  # a result alone: a backend that sent no deltas
            if self._read(token, entropy):
                return self._decide()
        return self._decide() if isinstance(item, GenerationResult) else None

    def _read(self, token: int, entropy: float) -> bool:
        """Read one token; True once the line has ended or the token budget is used."""
        piece = self.decode([token])
        self.entropy.append(entropy)
        ended = "\n" in piece and bool((self.text + piece.split("\n", 1)[0]).strip())
        self.text += piece
        return ended or len(self.entropy) >= self.tokens

    def _decide(self) -> bool:
        score = self.score
        self.verdict = score is not None and score <= self.below
        return self.verdict

    def record(self, threshold: float) -> dict[str, Any]:
        """The decision's values for ``response_metadata["gravity"]["route"]``."""
        return {"route": DIRECT if self.verdict else REASON, "direct_score": self.score, "direct_below": threshold,
                "probe_tokens": len(self.entropy), "probe_answer": self.text.strip()}


def probes_unsettled(probe_answers: Sequence[str | None]) -> bool:
    """The last two settled probe answers differ: the reasoning had not made up its mind when it ended."""
    settled = [a for a in probe_answers if a]
    return len(settled) >= 2 and settled[-1] != settled[-2]


@dataclass(frozen=True)
class Escalation:
    """Whether a tier's finished output goes up to the next tier, and the values that said so."""

    escalate: bool
    score: float | None
    """The output's entropy quantile (nats)."""
    unsettled: bool
    why: str | None

    def record(self, tier: str, quantile: float, above: float) -> dict[str, Any]:
        return {"tier": tier, "escalated": self.escalate, "why": self.why, "score": self.score,
                "quantile": quantile, "escalate_above": above, "probes_unsettled": self.unsettled}


def escalation(entropy: Sequence[float], probe_answers: Sequence[str | None], answered: bool, quantile: float,
               above: float, on_unsettled: bool) -> Escalation:
    """Escalate when the output's entropy ``quantile`` is above ``above`` nats, when it ``answered`` nothing (no
    answer text, no tool call), or (with ``on_unsettled``) when its answer probes had not settled."""
    score = entropy_quantile(entropy, quantile)
    unsettled = probes_unsettled(probe_answers)
    if not answered:
        return Escalation(True, score, unsettled, "no answer")
    if score is None or score > above:
        return Escalation(True, score, unsettled, f"entropy q{quantile:g} {score if score is None else round(score, 3)}"
                          f" > {above:g}")
    if on_unsettled and unsettled:
        return Escalation(True, score, unsettled, "probes unsettled")
    return Escalation(False, score, unsettled, None)


def sure_reasoning(result: GenerationResult, end_marker: str, decode: Callable[[Sequence[int]], str],
                   quantile: float, above: float) -> list[int]:
    """The longest start of ``result``'s reasoning that would have stood by itself (its ``quantile`` entropy at
    most ``above`` nats): what an escalated call may continue from. Never a token the steering forced (a closing
    line break), the end-of-reasoning marker or anything after it."""
    marker = result.text.find(end_marker.strip())
    reasoning = result.text if marker < 0 else result.text[:marker]
    n = len(result.token_ids)
    if result.steering is not None and result.steering.reasoning_tokens is not None:
        n = min(n, result.steering.reasoning_tokens)  # the steering closed the reasoning here
    while n and not reasoning.startswith(decode(result.token_ids[:n])):
        n -= 1
    while n and (score := entropy_quantile(result.entropy[:n], quantile)) is not None and score > above:
        n -= 1
    return list(result.token_ids[:n])
