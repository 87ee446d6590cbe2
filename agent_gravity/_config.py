"""Configuration at the public boundary: one pydantic model per concept."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ReasoningFormat(BaseModel):
    """How reasoning is delimited in the output: ``start`` reasoning ``end`` ``answer_prefix`` answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: str = "<think>\n"
    end: str = Field("</think>", min_length=1)
    answer_prefix: str = "\nAnswer:"
    scaffold: bool = True
    """Teach the format with an instruction and a one-shot example (for models with no native one)."""
    prefill_start: bool = True
    """Put ``start`` at the end of the prompt so the model begins inside its reasoning."""


NATIVE_THINK = ReasoningFormat(start="<think>\n", end="</think>", answer_prefix="\n\n", scaffold=False)


class GravityConfig(BaseModel):
    """When gravity fires and what it may do. Invalid values raise a ValidationError naming the field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    """False: same model and format, the entropy trace is still recorded, reasoning is never cut short."""
    window: int = 10
    """Tokens in the rolling window whose mean entropy is compared with ``threshold``."""
    threshold: float = Field(0.5, allow_inf_nan=False)
    """Mean entropy (nats) under which the window counts as locked in."""
    min_tokens: int = 16
    """Reasoning tokens before gravity may fire."""
    max_reasoning_tokens: int = 256
    """Reasoning is closed for the model after this many tokens, with or without gravity."""
    max_answer_tokens: int = 256
    """Budget the answer gets after reasoning ends."""
    reasoning: ReasoningFormat | Literal["auto"] | None = "auto"
    """``auto``: the model's native ``<think>`` format if its vocabulary has one, else a scaffold."""

    @field_validator("window", "max_reasoning_tokens", "max_answer_tokens")
    @classmethod
    def _positive(cls, value: int, info: Any) -> int:
        if value < 1:
            raise ValueError(f"{info.field_name} must be a positive number of tokens, got {value}")
        return value

    @field_validator("min_tokens")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"min_tokens must be 0 or more, got {value}")
        return value

    @field_validator("threshold", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"threshold must be a number of nats (for example 0.5), got {value!r}")
        if value <= 0:
            raise ValueError(f"threshold must be above 0 nats, got {value}")
        return value

    @model_validator(mode="after")
    def _can_fire(self) -> GravityConfig:
        if self.enabled and self.min_tokens >= self.max_reasoning_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be below max_reasoning_tokens "
                             f"({self.max_reasoning_tokens}), or gravity could never fire")
        return self

    def policy_spec(self) -> dict[str, Any] | None:
        """The policy spec the engine runs, or None when gravity is off."""
        if not self.enabled:
            return None
        return {"name": "window_mean", "window": self.window, "threshold": self.threshold}
