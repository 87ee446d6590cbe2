"""Change-point policy: a one-sided CUSUM test for the switch from uncertain to confident."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity.policies.base import Lock, Observation, check


@dataclass
class CusumPolicy:
    """Lock once entropy has shifted down from its opening level and now sits under ``ceiling``.

    The opening ``warmup`` tokens set the reference level of the uncertain phase. Page's
    statistic ``S = max(0, S + reference - drift - x)`` grows while entropy runs below the
    reference by more than ``drift``; crossing ``decision`` marks the change point. The
    ``ceiling`` on the recent mean keeps a drop from 3 nats to 2 from counting as confident.
    """

    name: ClassVar[str] = "cusum"
    warmup: int = 12
    drift: float = 0.3
    decision: float = 5.0
    ceiling: float = 0.8
    window: int = 6
    _opening: list[float] = field(init=False, default_factory=list, repr=False)
    _recent: deque[float] = field(init=False, repr=False)
    _statistic: float = field(init=False, default=0.0, repr=False)

    def __post_init__(self) -> None:
        check(self.warmup >= 1, f"warmup must be >= 1, got {self.warmup}")
        check(self.drift >= 0, f"drift must be >= 0 nats, got {self.drift}")
        check(self.decision > 0, f"decision must be above 0, got {self.decision}")
        check(self.ceiling > 0, f"ceiling must be above 0 nats, got {self.ceiling}")
        check(self.window >= 1, f"window must be >= 1, got {self.window}")
        self._recent = deque(maxlen=self.window)

    def observe(self, obs: Observation) -> Lock | None:
        if not math.isfinite(obs.entropy):
            return None
        self._recent.append(obs.entropy)
        if len(self._opening) < self.warmup:
            self._opening.append(obs.entropy)
            return None
        reference = sum(self._opening) / len(self._opening)
        self._statistic = max(0.0, self._statistic + reference - self.drift - obs.entropy)
        recent = sum(self._recent) / len(self._recent)
        if self._statistic < self.decision or recent >= self.ceiling:
            return None
        return Lock(obs.step, self.name, {"cusum": self._statistic, "decision": self.decision,
                                          "reference_entropy": reference, "recent_entropy": recent})
