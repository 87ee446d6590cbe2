"""Errors: each says what to fix, and subclasses the built-in error a caller would catch."""


class GravityError(Exception):
    """Base class of every agent-gravity error."""


class ModelNotFoundError(GravityError, FileNotFoundError):
    """The model folder does not exist or is not a model."""


class ModelCacheError(GravityError, RuntimeError):
    """The embedded model could not be fetched, verified or converted."""


class ContextLengthError(GravityError, ValueError):
    """The prompt and its generation budget do not fit in the model's context."""


class EngineError(GravityError, RuntimeError):
    """The engine failed while generating."""


class EngineMemoryError(GravityError, MemoryError):
    """A second engine would not fit in this process's memory."""
