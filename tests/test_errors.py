"""Every error subclasses the langchain-core error, and the built-in one, that a caller would catch."""

from __future__ import annotations

import pytest
from langchain_core import exceptions as lc

from agent_gravity import _errors as e


@pytest.mark.parametrize(("error", "bases"), [
    (e.ModelNotFoundError, (lc.ModelNotFoundError, FileNotFoundError)),
    (e.ModelCacheError, (lc.ModelError, RuntimeError)),
    (e.ContextLengthError, (lc.ContextOverflowError, ValueError)),
    (e.InvalidMessageError, (lc.ModelInvalidRequestError, ValueError)),
    (e.InvalidCallOptionError, (lc.ModelInvalidRequestError, TypeError)),
    (e.ToolSchemaError, (lc.ModelInvalidRequestError, ValueError)),
    (e.SchemaNotEnforceableError, (lc.ModelInvalidRequestError, ValueError)),
    (e.EngineError, (lc.ModelAPIError, RuntimeError)),
    (e.EngineTimeoutError, (lc.ModelTimeoutError, TimeoutError)),
    (e.EngineMemoryError, (lc.ModelError, MemoryError)),
    (e.SessionNotFoundError, (lc.ModelInvalidRequestError, KeyError)),
])
def test_errors_subclass_what_callers_catch(error, bases):
    assert issubclass(error, e.GravityError) and all(issubclass(error, b) for b in bases)
    assert str(error("what to fix")) == "what to fix"


def test_a_trim_budget_error_is_a_value_error_of_ours():
    from agent_gravity.trim import TrimBudgetError

    assert issubclass(TrimBudgetError, e.GravityError) and issubclass(TrimBudgetError, ValueError)
