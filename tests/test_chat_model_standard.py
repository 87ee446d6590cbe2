"""LangChain's standard unit suite for chat models, with capability flags that tell the truth."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from tests._chat_gravity_suite import ChatGravityCapabilities


class TestChatGravityStandard(ChatGravityCapabilities, ChatModelUnitTests):
    @property
    def standard_chat_model_params(self) -> dict:
        params = dict(super().standard_chat_model_params)
        del params["api_key"]  # a local engine has no key to take; the suite adds one for hosted APIs
        return params
