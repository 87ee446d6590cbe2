"""EWMA policy: exponentially weighted means of entropy and varentropy both settle low."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity._limits import MAX_NATS, MAX_TOKENS, bounded
from agent_gravity.policies.base import Lock, Observation


@dataclass
class EwmaPolicy:
    """Lock while the EWMA of entropy is under ``threshold`` and that of varentropy under ``varentropy_threshold``.

    Varentropy separates a confident model (one clear choice) from one torn between two
    equally likely words, which entropy alone can confuse. A backend that reports no
    varentropy (NaN) is judged on entropy alone, and the lock's values say so.
    """

    name: ClassVar[str] = "ewma"
    alpha: float = 0.15
    threshold: float = 0.6
    varentropy_threshold: float = 1.5
    warmup: int = 8
    _entropy: float = field(init=False, default=math.nan, repr=False)
    _varentropy: float = field(init=False, default=math.nan, repr=False)
    _seen: int = field(init=False, default=0, repr=False)

    def __post_init__(self) -> None:
        bounded("alpha", self.alpha, 0, 1, above=True)
        bounded("threshold", self.threshold, 0, MAX_NATS, above=True)
        bounded("varentropy_threshold", self.varentropy_threshold, 0, MAX_NATS ** 2, above=True)
        bounded("warmup", self.warmup, 1, MAX_TOKENS)

    def observe(self, obs: Observation) -> Lock | None:
        if not math.isfinite(obs.entropy):
            return None
        self._entropy = _ewma(self._entropy, obs.entropy, self.alpha)
        if math.isfinite(obs.varentropy):
            self._varentropy = _ewma(self._varentropy, obs.varentropy, self.alpha)
        self._seen += 1
        torn = math.isfinite(self._varentropy) and not self._varentropy < self.varentropy_threshold
        if self._seen < self.warmup or not self._entropy < self.threshold or torn:
            return None
        values = {"ewma_entropy": self._entropy, "threshold": self.threshold}
        if math.isfinite(self._varentropy):
            values |= {"ewma_varentropy": self._varentropy, "varentropy_threshold": self.varentropy_threshold}
        return Lock(obs.step, self.name, values)


def _ewma(previous: float, value: float, alpha: float) -> float:
    return value if math.isnan(previous) else previous + alpha * (value - previous)
