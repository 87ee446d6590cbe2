"""LangChain's standard unit suite for chat models, with capability flags that tell the truth."""

from __future__ import annotations

from langchain_tests.unit_tests import ChatModelUnitTests

from agent_gravity import ChatGravity


class TestChatGravityStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatGravity]:
        return ChatGravity

    @property
    def standard_chat_model_params(self) -> dict:
        params = dict(super().standard_chat_model_params)
        del params["api_key"]  # a local engine has no key to take; the suite adds one for hosted APIs
        return params

    @property
    def chat_model_params(self) -> dict:
        return {"temperature": 0}

    # Not yet: tool calling arrives with its own implementation, not faked.
    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return "/models/another-local-model"
