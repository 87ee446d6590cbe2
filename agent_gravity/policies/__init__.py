"""Detection: gravity policies that decide when the token stream has locked in."""

from __future__ import annotations

from typing import Any

from agent_gravity.policies.base import GravityPolicy, Lock, Observation
from agent_gravity.policies.all_of import AllOfPolicy
from agent_gravity.policies.any_of import AnyOfPolicy
from agent_gravity.policies.cusum import CusumPolicy
from agent_gravity.policies.ewma import EwmaPolicy
from agent_gravity.policies.loop import LoopPolicy
from agent_gravity.policies.window_mean import WindowMeanPolicy

POLICIES: dict[str, type] = {cls.name: cls for cls in (
    WindowMeanPolicy, EwmaPolicy, CusumPolicy, LoopPolicy, AllOfPolicy, AnyOfPolicy)}


def policy_from_spec(spec: dict[str, Any]) -> GravityPolicy:
    """Build a fresh policy from ``{"name": ..., **parameters}``; ValueError says what to fix."""
    if not isinstance(spec, dict):
        raise ValueError(f"a policy spec is a dict like {{'name': 'window_mean', 'threshold': 0.5}}, got {spec!r}")
    params = dict(spec)
    name = params.pop("name", None)
    if name not in POLICIES:
        raise ValueError(f"unknown gravity policy {name!r}; choose one of {sorted(POLICIES)}")
    try:
        return POLICIES[name](**params)
    except TypeError as exc:
        raise ValueError(f"bad parameters for gravity policy {name!r}: {exc}") from exc


__all__ = ["POLICIES", "AllOfPolicy", "AnyOfPolicy", "CusumPolicy", "EwmaPolicy", "GravityPolicy", "Lock",
           "LoopPolicy", "Observation", "WindowMeanPolicy", "policy_from_spec"]
