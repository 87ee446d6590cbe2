"""A small agent on the real engine: one model call and one tool call under ``invoke_agent adder``."""

from __future__ import annotations

import pytest
from langchain_core.tools import tool

from agent_gravity import AgentLoop, gravity_loop

SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def adder_agent(chat):
    """``adder(question)``: asks the model once, then runs ``add`` once, as one ``@gravity_loop`` run."""
    @gravity_loop(max_steps=2, name="adder")
    def adder(question: str, loop: AgentLoop) -> str | None:
        for _ in loop:
            reply = loop.step(chat.invoke(question))
            loop.call_tool(add, {"name": "add", "args": {"a": 3, "b": 5}, "id": "call-1", "type": "tool_call"})
            return reply.text
        return None
    return adder
