"""agent-gravity: entropy-steered inference middleware for LLM agents."""

__version__ = "0.1.0"

from agent_gravity._chat_model import ChatGravity  # noqa: E402
from agent_gravity._config import GravityConfig, ReasoningFormat  # noqa: E402
from agent_gravity._errors import (  # noqa: E402
    ContextLengthError,
    EngineError,
    EngineMemoryError,
    GravityError,
    ModelCacheError,
    ModelNotFoundError,
)

__all__ = [
    "ChatGravity",
    "ContextLengthError",
    "EngineError",
    "EngineMemoryError",
    "GravityConfig",
    "GravityError",
    "ModelCacheError",
    "ModelNotFoundError",
    "ReasoningFormat",
    "__version__",
]
