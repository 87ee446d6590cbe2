"""LangChain's standard integration suite, on the embedded model and the real local vLLM engine."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytest.importorskip("vllm", reason="the vLLM extra is not installed")

from tests._chat_gravity_suite import ChatGravityCapabilities  # noqa: E402


@pytest.mark.usefixtures("chat")  # the engine starts once; every model the suite builds joins it
class TestChatGravityIntegration(ChatGravityCapabilities, ChatModelIntegrationTests):
    # Limits of the 135M embedded model, not of ChatGravity: the grammar holds each output to its
    # schema, but it cannot make this model pick sensible content.
    @pytest.mark.xfail(reason="SmolLM2-135M does not decide to call a tool unprompted (tool_choice auto): it "
                              "answers in text; forced tool calls pass in test_tool_calling and test_tool_choice")
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model) -> None:  # type: ignore[override]
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason="SmolLM2-135M writes the free-text string argument on past the token budget, so "
                              "the forced call is cut and surfaces in invalid_tool_calls")
    def test_bind_runnables_as_tools(self, model) -> None:  # type: ignore[override]
        super().test_bind_runnables_as_tools(model)

    @pytest.mark.xfail(reason="SmolLM2-135M does not copy Chinese or Japanese names into a forced string "
                              "argument before the token budget ends the call")
    def test_unicode_tool_call_integration(self, model, *, tool_choice=None,  # type: ignore[override]
                                           force_tool_call=True) -> None:
        super().test_unicode_tool_call_integration(model, tool_choice=tool_choice, force_tool_call=force_tool_call)

    @pytest.mark.xfail(reason="json_mode holds the output to any JSON object, not to the schema; SmolLM2-135M "
                              "then nests the first key in itself until the budget ends")
    def test_json_mode(self, model) -> None:  # type: ignore[override]
        super().test_json_mode(model)
