"""Errors: each says what to fix, and subclasses the langchain-core or built-in error a caller would catch."""

from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAPIError,
    ModelError,
    ModelInvalidRequestError,
    ModelTimeoutError,
)
from langchain_core.exceptions import ModelNotFoundError as _LCModelNotFoundError


class GravityError(Exception):
    """Base class of every agent-gravity error."""


class ModelNotFoundError(GravityError, _LCModelNotFoundError, FileNotFoundError):
    """The model folder does not exist or is not a model."""


class ModelCacheError(GravityError, ModelError, RuntimeError):
    """The embedded model could not be fetched, verified or converted."""


class ContextLengthError(GravityError, ContextOverflowError, ValueError):
    """The prompt and its generation budget do not fit in the model's context."""


class InvalidMessageError(GravityError, ModelInvalidRequestError, ValueError):
    """A message the model cannot take: an empty list, an unknown role, a non-text block."""


class InvalidCallOptionError(GravityError, ModelInvalidRequestError, TypeError):
    """A per-call option the chat model does not have."""


class ToolSchemaError(InvalidCallOptionError, ValueError):
    """A bound tool whose schema cannot be rendered or held to by the grammar."""


class SchemaNotEnforceableError(InvalidCallOptionError, ValueError):
    """A structured-output or tool schema the engine's grammar cannot enforce."""


class SessionNotFoundError(GravityError, ModelInvalidRequestError, KeyError):
    """A KV session that does not exist (trimmed or ended before it was made, or already ended)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class EngineError(GravityError, ModelAPIError, RuntimeError):
    """The engine failed while generating, or was closed."""


class EngineTimeoutError(GravityError, ModelTimeoutError, TimeoutError):
    """A call ran past its ``timeout``; the request was aborted and freed its slot."""

    @classmethod
    def after(cls, timeout: float | None) -> "EngineTimeoutError":
        """The error for a request that ran past ``timeout`` seconds."""
        return cls(f"generation took longer than its timeout of {timeout} s and was aborted; raise `timeout`, "
                   "or lower the token budgets")


class EngineMemoryError(GravityError, ModelError, MemoryError):
    """A second engine would not fit in this process's memory."""


class DashboardError(GravityError, RuntimeError):
    """The tracing dashboard could not be started or stopped: Phoenix missing, a port taken, a failed start."""


class UpstreamRejectedError(GravityError, ModelInvalidRequestError, ValueError):
    """An OpenAI-compatible server refused the request (HTTP 4xx); its message says what to fix."""


class UpstreamAuthError(EngineError):
    """An OpenAI-compatible server refused the API key (HTTP 401 or 403)."""
