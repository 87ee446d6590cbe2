"""Entropy of a next-token distribution seen only through its top log-probabilities, with a hard bound.

A server that returns the ``k`` most likely tokens hides the rest of the vocabulary. What is hidden is
the leftover mass ``r = 1 - sum(p_top)``, spread over ``n`` unseen tokens, none more likely than the
least likely token shown (``p_min``). Its entropy lies between ``r * log(1/p_min)`` (each unseen token as
likely as allowed) and ``r * log(n/r)`` (spread evenly); the estimate is the middle of that interval and
the bound its half-width, so the exact entropy is never further from the estimate than the bound.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class EntropyEstimate:
    """An entropy estimate (nats) and the most it can be off by."""

    value: float
    bound: float


def estimate_entropy(top_logprobs: Iterable[float], vocab_size: int, top_k: int | None = None) -> EntropyEstimate:
    """Estimate the entropy of a distribution from the log-probabilities of its most likely tokens.

    ``top_k``: how many of ``top_logprobs`` are the true top of the distribution (a server may add the
    sampled token after them); the least likely of those caps every unseen token. None: all of them.
    """
    logprobs = sorted((lp for lp in top_logprobs if lp > -math.inf), reverse=True)
    if not logprobs:
        raise ValueError("no finite log-probability to estimate an entropy from")
    probs = [math.exp(lp) for lp in logprobs]
    known = -sum(p * lp for p, lp in zip(probs, logprobs))
    rest = max(0.0, 1.0 - sum(probs))
    unseen = vocab_size - len(probs)
    if rest <= 1e-12 or unseen <= 0:
        return EntropyEstimate(known, 0.0)
    low = rest * -logprobs[min(len(probs), top_k or len(probs)) - 1]  # the least likely shown caps the rest
    high = rest * math.log(unseen / rest)
    high = max(high, low)  # rounding in the server's log-probabilities can cross them by a hair
    return EntropyEstimate(known + (low + high) / 2, (high - low) / 2)
