"""Detection: gravity policies that decide when the entropy stream has locked in."""

from __future__ import annotations

from typing import Any

from agent_gravity.policies.base import GravityPolicy, Lock
from agent_gravity.policies.window_mean import WindowMeanPolicy

POLICIES: dict[str, type] = {WindowMeanPolicy.name: WindowMeanPolicy}


def policy_from_spec(spec: dict[str, Any]) -> GravityPolicy:
    """Build a fresh policy from ``{"name": ..., **parameters}``."""
    params = dict(spec)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise ValueError(f"unknown gravity policy {name!r}; choose one of {sorted(POLICIES)}")
    return POLICIES[name](**params)


__all__ = ["POLICIES", "GravityPolicy", "Lock", "WindowMeanPolicy", "policy_from_spec"]
