"""ChatGravity logic that needs no model: format choice and call options."""

import pytest

from agent_gravity import ChatGravity, GravityConfig, ReasoningFormat
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
    with pytest.raises(TypeError, match=r"unsupported call options \['max_tokenz'\]"):
        ChatGravity()._prepare([], None, {"max_tokenz": 3})
