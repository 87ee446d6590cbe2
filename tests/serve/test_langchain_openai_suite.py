"""LangChain's standard integration suite, through langchain-openai's ChatOpenAI pointed at the gravity proxy.

The chain is what an agent in another framework meets: an OpenAI client, the proxy, and a vLLM server running
the plugin, on the embedded model.
"""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI
from langchain_tests.integration_tests import ChatModelIntegrationTests

from agent_gravity import ChatGravity
from agent_gravity.bench.serve import serving
from agent_gravity.serve import create_app
from tests._chat_gravity_suite import EmbeddedModelLimits, GravityCapabilities

pytestmark = pytest.mark.engine
_URL: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def proxied(vllm_servers):
    with serving(create_app(ChatGravity(base_url=vllm_servers["plugin"]))) as url:
        _URL.append(url + "/v1")
        yield
        _URL.clear()


class TestChatOpenAIThroughTheProxy(GravityCapabilities, EmbeddedModelLimits, ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatOpenAI]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        return {"base_url": _URL[0], "api_key": "unused", "model": "SmolLM2-135M-Instruct", "temperature": 0,
                "stream_usage": True}

    @property
    def model_override_value(self) -> str:
        return "SmolLM2-135M-Instruct"  # the one model the proxy serves
