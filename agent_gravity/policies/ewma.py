"""EWMA policy: exponentially weighted means of entropy and varentropy both settle low."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity.policies.base import Lock, Observation, check


@dataclass
class EwmaPolicy:
    """Lock while the EWMA of entropy is under ``threshold`` and that of varentropy under ``varentropy_threshold``.

    Varentropy separates a confident model (one clear choice) from one torn between two
    equally likely words, which entropy alone can confuse.
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
        check(0 < self.alpha <= 1, f"alpha must be in (0, 1], got {self.alpha}")
        check(self.threshold > 0, f"threshold must be above 0 nats, got {self.threshold}")
        check(self.varentropy_threshold > 0, f"varentropy_threshold must be above 0, got {self.varentropy_threshold}")
        check(self.warmup >= 1, f"warmup must be >= 1, got {self.warmup}")

    def observe(self, obs: Observation) -> Lock | None:
        if not (math.isfinite(obs.entropy) and math.isfinite(obs.varentropy)):
            return None
        self._entropy = _ewma(self._entropy, obs.entropy, self.alpha)
        self._varentropy = _ewma(self._varentropy, obs.varentropy, self.alpha)
        self._seen += 1
        if self._seen < self.warmup or not (self._entropy < self.threshold
                                             and self._varentropy < self.varentropy_threshold):
            return None
        return Lock(obs.step, self.name, {"ewma_entropy": self._entropy, "threshold": self.threshold,
                                          "ewma_varentropy": self._varentropy,
                                          "varentropy_threshold": self.varentropy_threshold})


def _ewma(previous: float, value: float, alpha: float) -> float:
    return value if math.isnan(previous) else previous + alpha * (value - previous)
