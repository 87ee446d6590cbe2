"""Any-of composition: the first child policy to lock decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_gravity.policies._children import build_children, merged
from agent_gravity.policies.base import GravityPolicy, Lock, Observation


@dataclass
class AnyOfPolicy:
    """Lock as soon as any child policy locks; the lock names the child that fired."""

    name: ClassVar[str] = "any_of"
    policies: list[Any] = field(default_factory=lambda: [{"name": "cusum"}, {"name": "loop"}])
    _children: list[GravityPolicy] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._children = build_children(self.policies, self.name)

    def observe(self, obs: Observation) -> Lock | None:
        locks = [lock for lock in (child.observe(obs) for child in self._children) if lock is not None]
        return merged(obs.step, self.name, locks) if locks else None
