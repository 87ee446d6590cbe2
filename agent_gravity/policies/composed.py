"""Composition: combine policies so one lock is confirmed by another, or either may fire."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent_gravity.policies.base import GravityPolicy, Lock, Observation, check


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
        self._children = _build(self.policies, self.name)
        check(self.within >= 0, f"within must be >= 0 tokens, got {self.within}")
        self._last = [None] * len(self._children)

    def observe(self, obs: Observation) -> Lock | None:
        for i, child in enumerate(self._children):
            self._last[i] = child.observe(obs) or self._last[i]
        if any(lock is None or obs.step - lock.step > self.within for lock in self._last):
            return None
        return _merged(obs.step, self.name, [lock for lock in self._last if lock is not None])


@dataclass
class AnyOfPolicy:
    """Lock as soon as any child policy locks; the lock names the child that fired."""

    name: ClassVar[str] = "any_of"
    policies: list[Any] = field(default_factory=lambda: [{"name": "cusum"}, {"name": "loop"}])
    _children: list[GravityPolicy] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._children = _build(self.policies, self.name)

    def observe(self, obs: Observation) -> Lock | None:
        locks = [lock for lock in (child.observe(obs) for child in self._children) if lock is not None]
        return _merged(obs.step, self.name, locks) if locks else None


def _build(specs: list[Any], name: str) -> list[GravityPolicy]:
    from agent_gravity.policies import policy_from_spec  # the registry imports this module

    check(bool(specs) and isinstance(specs, list), f"{name} needs a non-empty list of policy specs")
    return [policy_from_spec(spec) for spec in specs]


def _merged(step: int, name: str, locks: list[Lock]) -> Lock:
    """One lock naming every child that fired; a loop in any child makes it a loop."""
    names = [lock.policy for lock in locks]
    tags = [name if names.count(name) == 1 else f"{name}#{i}" for i, name in enumerate(names)]
    values = {f"{tag}.{key}": value for tag, lock in zip(tags, locks) for key, value in lock.values.items()}
    reason = "loop" if any(lock.reason == "loop" for lock in locks) else "gravity"
    return Lock(step, f"{name}({', '.join(lock.policy for lock in locks)})", values, reason)
