"""@gravity_loop on hand-written loops: convergence, the runaway guard, sync and async, and spans."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from agent_gravity import AgentLoop, ConvergenceConfig, gravity_loop


@tool
def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def reply(x: int | None, text: str = "") -> AIMessage:
    calls = [] if x is None else [{"name": "double", "args": {"x": x}, "id": f"c{x}", "type": "tool_call"}]
    return AIMessage(text, tool_calls=calls)


def scripted(replies: list[AIMessage], **kw):
    @gravity_loop(**kw)
    def agent(loop: AgentLoop) -> str | None:
        script = iter(replies)
        for _ in loop:
            message = loop.step(next(script))
            if not message.tool_calls:
                return message.text
            for c in message.tool_calls:
                loop.call_tool(double, c)
        return None
    return agent


def test_a_converged_loop_returns_the_best_answer_the_reason_and_the_steps_saved(spans):
    result = scripted([reply(4), reply(4), reply(4)], max_steps=10)()
    assert (result.answer, result.reason, result.steps, result.steps_saved) == ("8", "repeated_tool_call", 2, 8)
    agent_span, = [s for s in spans.get_finished_spans() if s.name == "invoke_agent agent"]
    tools = [s for s in spans.get_finished_spans() if s.name == "execute_tool double"]
    assert len(tools) == 2 and all(t.parent.span_id == agent_span.context.span_id for t in tools)
    assert agent_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent_span.attributes["agent_gravity.agent.reason"] == "repeated_tool_call"
    assert tools[0].attributes["gen_ai.tool.name"] == "double" and tools[0].attributes["gen_ai.tool.call.id"] == "c4"


def test_a_loop_the_model_ends_returns_its_answer():
    result = scripted([reply(1), reply(None, "The answer is 2.")])()
    assert (result.answer, result.reason, result.steps, result.steps_saved) == ("The answer is 2.", "model_ended", 2, 0)


def test_a_runaway_loop_stops_at_max_steps():
    result = scripted([reply(i) for i in range(10)], max_steps=3,
                      converge=ConvergenceConfig(repeated_call=None))()
    assert (result.reason, result.steps, result.steps_saved, result.answer) == ("max_steps", 3, 0, "4")


async def test_async_loops_work_the_same_way(spans):
    @gravity_loop(max_steps=5, name="solver")
    async def agent(loop: AgentLoop) -> str | None:
        for step in loop:
            message = loop.step(reply(7))
            for c in message.tool_calls:
                await loop.acall_tool(double, c)
        return None

    result = await agent()
    assert (result.answer, result.reason, result.steps) == ("14", "repeated_tool_call", 2)
    assert [s.name for s in spans.get_finished_spans()][-1] == "invoke_agent solver"


def test_a_final_answer_that_repeats_the_last_one_ends_the_loop_as_the_model_ended_it():
    result = scripted([reply(1, "The answer is 42."), reply(None, "The answer is 42.")], max_steps=8)()
    assert (result.reason, result.steps_saved, result.answer) == ("model_ended", 0, "The answer is 42.")


def test_the_converge_configs_step_budget_holds_unless_max_steps_is_given():
    fresh = ConvergenceConfig(repeated_call=None, max_steps=3)
    assert scripted([reply(i) for i in range(10)], converge=fresh)().steps == 3
    assert scripted([reply(i) for i in range(10)], converge=fresh, max_steps=5)().steps == 5
    with pytest.raises(ValueError, match="max_steps"):
        gravity_loop(max_steps=0)


def test_a_function_without_a_loop_parameter_is_refused():
    with pytest.raises(TypeError, match="must take a `loop` parameter"):
        gravity_loop()(lambda question: question)
