"""Change-point policy: a one-sided CUSUM test for the switch from uncertain to confident."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

from agent_gravity._limits import MAX_NATS, MAX_TOKENS, MAX_WINDOW, bounded
from agent_gravity.policies.base import Lock, Observation


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
        bounded("warmup", self.warmup, 1, MAX_WINDOW)
        bounded("drift", self.drift, 0, MAX_NATS)
        bounded("decision", self.decision, 0, MAX_NATS * MAX_TOKENS, above=True)
        bounded("ceiling", self.ceiling, 0, MAX_NATS, above=True)
        bounded("window", self.window, 1, MAX_WINDOW)
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
