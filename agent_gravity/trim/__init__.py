"""KV trim policies: one extension point (``TrimPolicy.select``), one policy per file."""

from __future__ import annotations

from typing import Any

from agent_gravity._spec import from_spec
from agent_gravity.trim.base import Budget, LayerStretch, Reconstruction, TrimBudgetError, TrimPolicy
from agent_gravity.trim.gravity_zone import GravityZone
from agent_gravity.trim.head_entropy import HeadEntropyPolicy
from agent_gravity.trim.reconstruction import ReconstructionPolicy
from agent_gravity.trim.snapkv import SnapKVPolicy
from agent_gravity.trim.streaming_llm import StreamingLLMPolicy

TRIM_POLICIES: dict[str, type] = {cls().name: cls for cls in (
    HeadEntropyPolicy, ReconstructionPolicy, SnapKVPolicy, StreamingLLMPolicy)}


def trim_policy_from_spec(spec: dict[str, Any]) -> TrimPolicy:
    """A policy from ``{"name": ..., **params}``; ValueError names the known ones and the bad parameter."""
    return from_spec(TRIM_POLICIES, spec, "trim policy", "{'name': 'snapkv'}")


__all__ = ["Budget", "GravityZone", "HeadEntropyPolicy", "LayerStretch", "Reconstruction", "ReconstructionPolicy",
           "SnapKVPolicy", "StreamingLLMPolicy", "TRIM_POLICIES", "TrimBudgetError", "TrimPolicy",
           "trim_policy_from_spec"]
