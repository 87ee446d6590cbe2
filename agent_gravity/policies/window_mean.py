"""Windowed-mean policy: the mean entropy of the last ``window`` tokens stays under ``threshold``."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity.policies.base import Lock


@dataclass
class WindowMeanPolicy:
    """Fire when the rolling mean entropy over ``window`` tokens drops below ``threshold`` nats."""

    name: ClassVar[str] = "window_mean"
    window: int = 10
    threshold: float = 1.0
    _recent: deque[float] = field(init=False, repr=False)
    _total: float = field(init=False, default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        self._recent = deque(maxlen=self.window)

    def observe(self, step: int, entropy: float) -> Lock | None:
        if not math.isfinite(entropy):  # a step the engine never showed us: no evidence either way
            return None
        if len(self._recent) == self.window:
            self._total -= self._recent[0]
        self._recent.append(entropy)
        self._total += entropy
        if len(self._recent) < self.window:
            return None
        mean = self._total / self.window
        if not mean < self.threshold:
            return None
        return Lock(
            step=step,
            policy=self.name,
            values={"mean_entropy": mean, "threshold": self.threshold, "window": float(self.window)},
        )
