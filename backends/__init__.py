"""Backends: engines that generate tokens and report the entropy signal, behind one interface."""

from agent_gravity.backends.base import (
    Backend,
    GenerationDelta,
    GenerationRequest,
    GenerationResult,
    SamplingSettings,
)

__all__ = ["Backend", "GenerationDelta", "GenerationRequest", "GenerationResult", "SamplingSettings"]
