"""Backends: engines that generate tokens and report the entropy signal, behind one interface.

Public names load on first use, so the attention modules (``_adaptive_prefill``, ``_ragged_cache``) import with
torch and Triton alone, as the GPU check runs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Backend", "GenerationDelta", "GenerationRequest", "GenerationResult", "SamplingSettings"]

if TYPE_CHECKING:
    from agent_gravity.backends.base import (
        Backend,
        GenerationDelta,
        GenerationRequest,
        GenerationResult,
        SamplingSettings,
    )


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'agent_gravity.backends' has no attribute {name!r}")
    value = getattr(importlib.import_module("agent_gravity.backends.base"), name)
    globals()[name] = value
    return value
