"""All-of composition: one lock confirmed by the others within a few tokens."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_gravity._limits import MAX_TOKENS, bounded
from agent_gravity.policies._children import build_children, merged
from agent_gravity.policies.base import GravityPolicy, Lock, Observation


@dataclass
class AllOfPolicy:
    """Lock when every child policy has locked within the last ``within`` tokens.

    ``within=0`` asks for all of them on the same token; a larger value lets a fast
    detector be confirmed by a slower one a few tokens later.
    """

    name: ClassVar[str] = "all_of"
    policies: list[Any] = field(default_factory=lambda: [{"name": "window_mean"}, {"name": "ewma"}])
    within: int = 0
    _children: list[GravityPolicy] = field(init=False, repr=False)
    _last: list[Lock | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._children = build_children(self.policies, self.name)
        bounded("within", self.within, 0, MAX_TOKENS)
        self._last = [None] * len(self._children)

    def observe(self, obs: Observation) -> Lock | None:
        for i, child in enumerate(self._children):
            self._last[i] = child.observe(obs) or self._last[i]
        if any(lock is None or obs.step - lock.step > self.within for lock in self._last):
            return None
        return merged(obs.step, self.name, [lock for lock in self._last if lock is not None])
