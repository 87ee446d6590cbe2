"""ChatGravity logic that needs no model: format choice and call options."""

import pytest

from pydantic import ValidationError

from agent_gravity import ChatGravity, GravityConfig, InvalidCallOptionError, ReasoningFormat
from agent_gravity._config import NATIVE_THINK


class _Vocab:
    def __init__(self, single: set[str]) -> None:
        self.single = single

    def single_token_id(self, text: str):
        return 7 if text in self.single else None


def test_auto_format_uses_a_native_think_vocabulary_and_scaffolds_otherwise():
    auto = GravityConfig()
    assert ChatGravity._format(_Vocab({"<think>", "</think>"}), auto) == NATIVE_THINK
    assert ChatGravity._format(_Vocab(set()), auto) == ReasoningFormat()
    custom = ReasoningFormat(end="[/reason]", answer_prefix="\nFinal:")
    assert ChatGravity._format(_Vocab(set()), GravityConfig(reasoning=custom)) is custom
    assert ChatGravity._format(_Vocab(set()), GravityConfig(reasoning=None)) is None


def test_unknown_call_options_are_refused_before_any_engine_starts():
    with pytest.raises(InvalidCallOptionError, match=r"unsupported call options \['max_tokenz'\]"):
        ChatGravity()._prepare([], None, {"max_tokenz": 3})
    with pytest.raises(ValidationError, match="max_answer_tokens must be a number from 1"):
        ChatGravity()._prepare([], None, {"gravity": {"max_answer_tokens": 0}})
    with pytest.raises(ValidationError, match="temperature"):
        ChatGravity()._prepare([], None, {"temperature": -1})


def test_constructor_options_are_validated_and_unknown_ones_refused():
    with pytest.raises(ValidationError, match="gravty"):
        ChatGravity(gravty=GravityConfig())
    with pytest.raises(ValidationError, match="top_p"):
        ChatGravity(top_p=0)


def test_a_fixed_backend_cannot_switch_models_per_call():
    from types import SimpleNamespace

    from langchain_core.messages import HumanMessage

    model = ChatGravity(backend=SimpleNamespace(model_name="fixed"))
    with pytest.raises(InvalidCallOptionError, match="fixed backend that serves one model"):
        model._prepare([HumanMessage("hi")], None, {"model": "/models/other"})
    assert model._get_ls_params(model="/models/other")["ls_model_name"] == "/models/other"
