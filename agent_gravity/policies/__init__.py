"""Detection: gravity policies that decide when the token stream has locked in."""

from __future__ import annotations

from typing import Any

from agent_gravity._limits import limit_policies
from agent_gravity._spec import from_spec
from agent_gravity.policies.all_of import AllOfPolicy
from agent_gravity.policies.any_of import AnyOfPolicy
from agent_gravity.policies.base import GravityPolicy, Lock, Observation
from agent_gravity.policies.cusum import CusumPolicy
from agent_gravity.policies.ewma import EwmaPolicy
from agent_gravity.policies.loop import LoopPolicy
from agent_gravity.policies.window_mean import WindowMeanPolicy

POLICIES: dict[str, type] = {cls.name: cls for cls in (
    WindowMeanPolicy, EwmaPolicy, CusumPolicy, LoopPolicy, AllOfPolicy, AnyOfPolicy)}


def policy_from_spec(spec: dict[str, Any]) -> GravityPolicy:
    """Build a fresh policy from ``{"name": ..., **parameters}``; ValueError says what to fix."""
    limit_policies(spec)
    return from_spec(POLICIES, spec, "gravity policy", "{'name': 'window_mean', 'threshold': 0.5}")


__all__ = ["POLICIES", "AllOfPolicy", "AnyOfPolicy", "CusumPolicy", "EwmaPolicy", "GravityPolicy", "Lock",
           "LoopPolicy", "Observation", "WindowMeanPolicy", "policy_from_spec"]
