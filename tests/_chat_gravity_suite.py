"""What LangChain's standard suites are told about ChatGravity: capability flags that tell the truth, and the
limits of the embedded model that the integration suites meet."""

from __future__ import annotations

import pytest
from langchain_core.exceptions import OutputParserException
from openai import LengthFinishReasonError

from agent_gravity import ChatGravity


class GravityCapabilities:
    """What gravity's chat completions can do, however they are reached: ChatGravity, or an OpenAI client
    through the gravity proxy."""

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True



class ChatGravityCapabilities(GravityCapabilities):
    """Mixed into ChatGravity's unit and integration suites, so both judge the same declared capabilities."""

    @property
    def chat_model_class(self) -> type[ChatGravity]:
        return ChatGravity

    @property
    def chat_model_params(self) -> dict:
        return {"temperature": 0}

    @property
    def model_override_value(self) -> str:
        return "SmolLM2-135M-Instruct"  # the embedded model answers to its name (any local folder also works)


CUT = (OutputParserException, LengthFinishReasonError)
"""A structured output cut by the token budget, as ChatGravity and as OpenAI's client refuse it."""


SHORT = {"max_tokens": 64}
"""The budget the expected failures run at: what they check needs fewer tokens, and each failure is the model
running on to its budget, at any budget."""


class EmbeddedModelLimits:
    """Integration tests the 135M embedded model fails on its own: the grammar holds each output to its schema,
    but it cannot make this model pick sensible content. Mixed in before the integration suite. Each is strict and
    names the failure it expects, so a product error cannot pass as the model's limit and a fixed limit shows."""

    @pytest.mark.xfail(strict=True, raises=AssertionError,
                       reason="SmolLM2-135M does not decide to call a tool unprompted (tool_choice auto): it "
                              "answers in text; forced tool calls pass in test_tool_calling and test_tool_choice")
    @pytest.mark.parametrize("model", [SHORT, {**SHORT, "output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model) -> None:
        super().test_agent_loop(model)  # type: ignore[misc]

    @pytest.mark.xfail(strict=True, raises=AssertionError,
                       reason="SmolLM2-135M writes the free-text string argument on past the token budget, so "
                              "the forced call is cut and surfaces in invalid_tool_calls")
    @pytest.mark.parametrize("model", [SHORT], indirect=True)
    def test_bind_runnables_as_tools(self, model) -> None:
        super().test_bind_runnables_as_tools(model)  # type: ignore[misc]

    @pytest.mark.xfail(strict=True, raises=AssertionError,
                       reason="SmolLM2-135M does not copy Chinese or Japanese names into a forced string "
                              "argument before the token budget ends the call")
    @pytest.mark.parametrize("model", [SHORT], indirect=True)
    def test_unicode_tool_call_integration(self, model, *, tool_choice=None, force_tool_call=True) -> None:
        super().test_unicode_tool_call_integration(  # type: ignore[misc]
            model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @pytest.mark.xfail(strict=True, raises=CUT,
                       reason="json_mode holds the output to any JSON object, not to the schema; SmolLM2-135M "
                              "then nests the first key in itself until the budget cuts the JSON, which is refused")
    @pytest.mark.parametrize("model", [SHORT], indirect=True)
    def test_json_mode(self, model) -> None:
        super().test_json_mode(model)  # type: ignore[misc]

    @pytest.mark.xfail(strict=True, raises=CUT,
                       reason="SmolLM2-135M repeats 'a cat is a cat, ' inside the joke's `setup` string until the "
                              "budget cuts the JSON; structured output is never cut early, and a cut one is refused "
                              "(ChatGravity used to parse it as if whole, closing the string itself)")
    @pytest.mark.parametrize("model", [SHORT], indirect=True)
    def test_structured_output_optional_param(self, model) -> None:
        super().test_structured_output_optional_param(model)  # type: ignore[misc]
