"""Loop policy: the output repeats the same stretch of tokens with low entropy."""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity._limits import MAX_NATS, MAX_PERIOD, MAX_REPEATS, MAX_TOKENS, bounded
from agent_gravity.policies.base import Lock, Observation


@dataclass
class LoopPolicy:
    """Lock (reason ``loop``) when the last tokens repeat one stretch ``repeats`` times at low entropy.

    For every period up to ``max_period`` a run counter tracks how many tokens in a row
    equal the token one period back, so each step costs ``max_period`` comparisons. The
    repeated span must cover ``min_span`` tokens, so a short list ("1, 1, 1") is no loop,
    and its mean entropy must be under ``threshold``: a model sure of repeating itself.
    """

    name: ClassVar[str] = "loop"
    repeats: int = 3
    max_period: int = 48
    min_span: int = 24
    threshold: float = 0.5
    _tokens: deque[int] = field(init=False, repr=False)
    _entropy: deque[float] = field(init=False, repr=False)
    _runs: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        bounded("repeats", self.repeats, 2, MAX_REPEATS)
        bounded("max_period", self.max_period, 1, MAX_PERIOD)
        bounded("min_span", self.min_span, 2, MAX_TOKENS)
        bounded("threshold", self.threshold, 0, MAX_NATS, above=True)
        span = self.max_period * self.repeats
        self._tokens, self._entropy = deque(maxlen=span + 1), deque(maxlen=span + 1)
        self._runs = [0] * (self.max_period + 1)

    def observe(self, obs: Observation) -> Lock | None:
        self._tokens.append(obs.token)
        self._entropy.append(obs.entropy if math.isfinite(obs.entropy) else math.inf)
        n = len(self._tokens)
        found = None
        for period in range(1, min(self.max_period, n - 1) + 1):  # every counter must move, so no early return
            same = self._tokens[-1] == self._tokens[-1 - period]
            self._runs[period] = self._runs[period] + 1 if same else 0
            span = period + self._runs[period]  # the first copy plus every token that repeated it
            if found is None and self._runs[period] >= period * (self.repeats - 1) and span >= self.min_span:
                mean = sum(itertools.islice(reversed(self._entropy), min(span, n))) / min(span, n)
                if mean < self.threshold:
                    found = Lock(obs.step, self.name, {"period": float(period), "span": float(span),
                                                       "mean_entropy": mean, "threshold": self.threshold},
                                 reason="loop")
        return found
