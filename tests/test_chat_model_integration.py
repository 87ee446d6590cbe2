"""LangChain's standard integration suite, on the embedded model and the real local vLLM engine."""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests

pytest.importorskip("vllm", reason="the vLLM extra is not installed")

from tests._chat_gravity_suite import ChatGravityCapabilities, EmbeddedModelLimits  # noqa: E402


@pytest.mark.usefixtures("chat")  # the engine starts once; every model the suite builds joins it
class TestChatGravityIntegration(ChatGravityCapabilities, EmbeddedModelLimits, ChatModelIntegrationTests):
    pass
