"""What the composing policies share: building children from specs, merging their locks into one."""

from __future__ import annotations

from typing import Any

from agent_gravity.policies.base import GravityPolicy, Lock, check


def build_children(specs: list[Any], name: str) -> list[GravityPolicy]:
    from agent_gravity.policies import policy_from_spec  # the registry imports this module

    check(bool(specs) and isinstance(specs, list), f"{name} needs a non-empty list of policy specs")
    return [policy_from_spec(spec) for spec in specs]


def merged(step: int, name: str, locks: list[Lock]) -> Lock:
    """One lock naming every child that fired; a loop in any child makes it a loop."""
    names = [lock.policy for lock in locks]
    tags = [child if names.count(child) == 1 else f"{child}#{i}" for i, child in enumerate(names)]
    values = {f"{tag}.{key}": value for tag, lock in zip(tags, locks) for key, value in lock.values.items()}
    reason = "loop" if any(lock.reason == "loop" for lock in locks) else "gravity"
    return Lock(step, f"{name}({', '.join(lock.policy for lock in locks)})", values, reason)
