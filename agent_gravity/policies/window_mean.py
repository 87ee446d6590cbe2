"""Windowed mean with hysteresis: the mean entropy of the last ``window`` tokens stays low."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity._limits import MAX_NATS, MAX_TOKENS, MAX_WINDOW, bounded
from agent_gravity.policies.base import Lock, Observation, check


@dataclass
class WindowMeanPolicy:
    """Lock once the rolling mean stays under ``threshold`` for ``patience`` tokens; unlock above ``release``.

    The patience keeps one short low stretch (a formula, a copied number) from firing;
    the release level (default ``1.5 * threshold``) keeps a lock from flickering.
    """

    name: ClassVar[str] = "window_mean"
    window: int = 10
    threshold: float = 1.0
    patience: int = 1
    release: float | None = None
    _recent: deque[float] = field(init=False, repr=False)
    _total: float = field(init=False, default=0.0, repr=False)
    _below: int = field(init=False, default=0, repr=False)
    _locked: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        bounded("window", self.window, 1, MAX_WINDOW)
        bounded("threshold", self.threshold, 0, MAX_NATS, above=True)
        bounded("patience", self.patience, 1, MAX_TOKENS)
        if self.release is None:
            self.release = 1.5 * self.threshold
        bounded("release", self.release, 0, 1.5 * MAX_NATS)
        check(self.release >= self.threshold, f"release ({self.release}) must be >= threshold ({self.threshold})")
        self._recent = deque(maxlen=self.window)

    def observe(self, obs: Observation) -> Lock | None:
        if not math.isfinite(obs.entropy):  # a step the engine never showed us: no evidence either way
            return None
        if len(self._recent) == self.window:
            self._total -= self._recent[0]
        self._recent.append(obs.entropy)
        self._total += obs.entropy
        if len(self._recent) < self.window:
            return None
        mean = self._total / self.window
        self._below = self._below + 1 if mean < self.threshold else 0
        if self._locked:
            self._locked = mean <= self.release
        else:
            self._locked = self._below >= self.patience
        if not self._locked:
            return None
        return Lock(obs.step, self.name, {"mean_entropy": mean, "threshold": self.threshold,
                                          "window": float(self.window), "patience": float(self.patience)})
