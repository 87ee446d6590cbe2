"""agent-gravity: entropy-steered inference middleware for LLM agents.

Public names load on first use, so ``agent_gravity.kernels`` imports with torch and Triton alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ChatGravity": "agent_gravity._chat_model",
    "GravityConfig": "agent_gravity._config",
    "ReasoningFormat": "agent_gravity._config",
    "ProbeConfig": "agent_gravity._config",
    "KVConfig": "agent_gravity._config",
    "ComputeConfig": "agent_gravity._config",
    "SpeculationConfig": "agent_gravity._config",
    "ZoneKVConfig": "agent_gravity._config",
    "LayerSkipConfig": "agent_gravity._config",
    "Top2Config": "agent_gravity._config",
    "TelemetryConfig": "agent_gravity._config",
    "RouteConfig": "agent_gravity._config",
    "Tier": "agent_gravity._config",
    "setup_tracing": "agent_gravity.telemetry._export",
    "entropy_trace": "agent_gravity.telemetry._trace_file",
    "GravityProfile": "agent_gravity._profile",
    "ConvergenceConfig": "agent_gravity._convergence",
    "GravityMiddleware": "agent_gravity._middleware",
    "gravity_loop": "agent_gravity._loop",
    "AgentLoop": "agent_gravity._loop",
    "LoopResult": "agent_gravity._loop",
    "SchemaNotEnforceableError": "agent_gravity._errors",
    "ToolSchemaError": "agent_gravity._errors",
    "SessionNotFoundError": "agent_gravity._errors",
    "load_profile": "agent_gravity._profile",
    "ContextLengthError": "agent_gravity._errors",
    "EngineError": "agent_gravity._errors",
    "EngineMemoryError": "agent_gravity._errors",
    "EngineTimeoutError": "agent_gravity._errors",
    "GravityError": "agent_gravity._errors",
    "InvalidCallOptionError": "agent_gravity._errors",
    "InvalidMessageError": "agent_gravity._errors",
    "ModelCacheError": "agent_gravity._errors",
    "ModelNotFoundError": "agent_gravity._errors",
    "UpstreamRejectedError": "agent_gravity._errors",
    "UpstreamAuthError": "agent_gravity._errors",
}
__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:
    from agent_gravity._chat_model import ChatGravity
    from agent_gravity._config import (
        ComputeConfig,
        GravityConfig,
        KVConfig,
        LayerSkipConfig,
        ProbeConfig,
        ReasoningFormat,
        RouteConfig,
        SpeculationConfig,
        TelemetryConfig,
        Tier,
        Top2Config,
        ZoneKVConfig,
    )
    from agent_gravity._convergence import ConvergenceConfig
    from agent_gravity._errors import (
        ContextLengthError,
        EngineError,
        EngineMemoryError,
        EngineTimeoutError,
        GravityError,
        InvalidCallOptionError,
        InvalidMessageError,
        ModelCacheError,
        ModelNotFoundError,
        SchemaNotEnforceableError,
        SessionNotFoundError,
        ToolSchemaError,
        UpstreamAuthError,
        UpstreamRejectedError,
    )
    from agent_gravity._loop import AgentLoop, LoopResult, gravity_loop
    from agent_gravity._middleware import GravityMiddleware
    from agent_gravity._profile import GravityProfile, load_profile
    from agent_gravity.telemetry._export import setup_tracing
    from agent_gravity.telemetry._trace_file import entropy_trace


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'agent_gravity' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
