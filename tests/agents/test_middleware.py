"""GravityMiddleware inside a real create_agent graph, driven by a scripted chat model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from agent_gravity import ConvergenceConfig, GravityConfig, GravityMiddleware

_ids = itertools.count()


@tool
def double(x: int) -> int:
    """Double a number."""
    return 2 * x


class ScriptedModel(GenericFakeChatModel):
    """Replies from a script; records the settings each call was bound with."""

    bound: list[dict[str, Any]] = []

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        self.bound.append(kwargs)
        return self


def call(x: int, text: str = "") -> AIMessage:
    calls = [{"name": "double", "args": {"x": x}, "id": f"c{next(_ids)}", "type": "tool_call"}]
    return AIMessage(text, tool_calls=calls,
                     usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15})


def agent(script: list[AIMessage], **kw: Any) -> Any:
    model = ScriptedModel(messages=iter(script))
    return create_agent(model, tools=[double], middleware=[GravityMiddleware(**kw)]), model


def test_a_repeated_tool_call_ends_the_run_with_the_tool_result_and_answers_the_pending_call():
    graph, _ = agent([call(3), call(3), call(3), AIMessage("never reached")])
    state = graph.invoke({"messages": [("user", "double 3")]})
    assert state["gravity"] == {"answer": "6", "reason": "repeated_tool_call", "converged": True, "steps": 2,
                                "detail": 'double({"x":3}) was asked for 2 times'}
    skipped = [m for m in state["messages"] if isinstance(m, ToolMessage) and m.status == "error"]
    assert len(skipped) == 1 and skipped[0].text.startswith("Not run: the agent converged")
    assert state["messages"][-1].text == "6"
    assert sum(isinstance(m, ToolMessage) and m.status != "error" for m in state["messages"]) == 1


def test_the_same_interim_answer_twice_ends_the_run():
    graph, _ = agent([call(1, "It is 8."), call(2, "it is 8"), AIMessage("x")])
    state = graph.invoke({"messages": [("user", "q")]})
    assert state["gravity"]["reason"] == "same_answer" and state["gravity"]["answer"] == "it is 8"


def test_a_run_the_model_ends_itself_is_reported_as_such():
    graph, _ = agent([call(1), AIMessage("The answer is 2.")])
    state = graph.invoke({"messages": [("user", "q")]})
    assert state["gravity"] == {"answer": "The answer is 2.", "reason": "model_ended", "detail": None,
                                "steps": 2, "converged": True}


def test_the_loop_guard_stops_a_runaway_that_never_converges():
    graph, _ = agent([call(i) for i in range(10)], converge=ConvergenceConfig(max_steps=3))
    state = graph.invoke({"messages": [("user", "q")]})
    assert state["gravity"]["reason"] == "max_steps" and not state["gravity"]["converged"]
    assert "runaway" in state["gravity"]["detail"] and state["gravity"]["answer"] == "2"
    assert sum(bool(isinstance(m, AIMessage) and m.tool_calls) for m in state["messages"]) == 3


async def test_async_runs_converge_the_same_way():
    graph, _ = agent([call(5), call(5)])
    state = await graph.ainvoke({"messages": [("user", "q")]})
    assert state["gravity"]["reason"] == "repeated_tool_call" and state["gravity"]["answer"] == "10"


def test_a_run_another_middleware_ends_says_so():
    from langchain.agents.middleware import ModelCallLimitMiddleware

    model = ScriptedModel(messages=iter([call(i) for i in range(5)]))
    graph = create_agent(model, tools=[double], middleware=[GravityMiddleware(),
                                                            ModelCallLimitMiddleware(run_limit=2)])
    outcome = graph.invoke({"messages": [("user", "q")]})["gravity"]
    assert outcome["reason"] == "stopped_by_agent" and not outcome["converged"] and outcome["steps"] == 2


def test_a_structured_response_is_the_answer():
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Final(BaseModel):
        answer: int

    done = AIMessage("", tool_calls=[{"name": "Final", "args": {"answer": 6}, "id": "f", "type": "tool_call"}])
    model = ScriptedModel(messages=iter([call(3), done]))
    graph = create_agent(model, tools=[double], middleware=[GravityMiddleware()], response_format=ToolStrategy(Final))
    outcome = graph.invoke({"messages": [("user", "q")]})["gravity"]
    assert outcome["reason"] == "model_ended" and outcome["answer"] == Final(answer=6) and outcome["steps"] == 2


def test_a_structured_response_on_the_last_step_is_not_judged_again():
    from langchain.agents.structured_output import ToolStrategy
    from pydantic import BaseModel

    class Final(BaseModel):
        answer: int

    done = AIMessage("", tool_calls=[{"name": "Final", "args": {"answer": 2}, "id": "f", "type": "tool_call"}])
    model = ScriptedModel(messages=iter([call(1), done]))
    graph = create_agent(model, tools=[double], response_format=ToolStrategy(Final),
                         middleware=[GravityMiddleware(ConvergenceConfig(max_steps=2))])
    state = graph.invoke({"messages": [("user", "q")]})
    assert state["gravity"]["reason"] == "model_ended" and state["structured_response"] == Final(answer=2)
    answers = [m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)]
    assert sorted(answers) == sorted(set(answers)), "each call has exactly one result"


def test_a_stopped_run_reports_the_best_answer_not_the_limit_message():
    from langchain.agents.middleware import ModelCallLimitMiddleware

    model = ScriptedModel(messages=iter([call(i) for i in range(1, 6)]))
    graph = create_agent(model, tools=[double], middleware=[GravityMiddleware(),
                                                            ModelCallLimitMiddleware(run_limit=2)])
    assert graph.invoke({"messages": [("user", "q")]})["gravity"]["answer"] == "4"


def test_each_run_starts_fresh_on_a_shared_middleware():
    middleware = GravityMiddleware()
    model = ScriptedModel(messages=iter([call(3), AIMessage("6"), call(3), AIMessage("6")]))
    graph = create_agent(model, tools=[double], middleware=[middleware])
    for _ in range(2):  # the second run repeats the first one's call, but it is a new run
        assert graph.invoke({"messages": [("user", "q")]})["gravity"]["reason"] == "model_ended"


def test_its_gravity_config_reaches_every_model_call():
    config = GravityConfig(enabled=False)
    graph, model = agent([AIMessage("done")], gravity=config)
    model.bound.clear()
    graph.invoke({"messages": [("user", "q")]})
    assert model.bound and all(b["gravity"] is config for b in model.bound)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_steps"):
        ConvergenceConfig(max_steps=0)
