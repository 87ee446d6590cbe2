"""What both LangChain standard suites are told about ChatGravity: capability flags that tell the truth."""

from __future__ import annotations

from agent_gravity import ChatGravity


class ChatGravityCapabilities:
    """Mixed into the unit and the integration suite, so both judge the same declared capabilities."""

    @property
    def chat_model_class(self) -> type[ChatGravity]:
        return ChatGravity

    @property
    def chat_model_params(self) -> dict:
        return {"temperature": 0}

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

    @property
    def model_override_value(self) -> str:
        return "SmolLM2-135M-Instruct"  # the embedded model answers to its name (any local folder also works)
