"""Agent-step convergence: same answers, repeated calls, low peak entropy, and the runaway guard."""

from __future__ import annotations

import math

import pytest
from langchain_core.messages import AIMessage, ToolMessage

from agent_gravity._convergence import ConvergenceConfig, ConvergenceTracker, Step, canonical_call, steps_saved


def _tracker(**kw) -> ConvergenceTracker:
    return ConvergenceTracker(ConvergenceConfig(**kw))


def test_two_steps_with_the_same_answer_converge():
    t = _tracker()
    assert t.observe(Step("The answer is 42.", ("lookup({})",))) is None
    verdict = t.observe(Step("the answer is 42", ("calculator({})",)))
    assert verdict.reason == "same_answer" and verdict.answer == "the answer is 42" and verdict.converged


def test_a_repeated_tool_call_converges_with_the_tool_result_as_answer():
    t = _tracker()
    call = canonical_call("calculator", {"expression": "2*3"})
    assert t.observe(Step("", (call,))) is None
    t.tool_result(ToolMessage("6", tool_call_id="1"))
    t.tool_result(ToolMessage("boom", tool_call_id="2", status="error"))  # a failed tool gives no answer
    verdict = t.observe(Step("", (call,)))
    assert verdict.reason == "repeated_tool_call" and verdict.answer == "6" and "2*3" in verdict.detail


def test_different_calls_do_not_converge_and_arguments_are_compared_in_key_order():
    assert canonical_call("f", {"b": 1, "a": 2}) == canonical_call("f", {"a": 2, "b": 1})
    t = _tracker()
    assert t.observe(Step("", (canonical_call("f", {"a": 1}),))) is None
    assert t.observe(Step("", (canonical_call("f", {"a": 2}),))) is None


def test_low_peak_entropy_for_k_steps_converges_and_nan_never_does():
    t = _tracker(low_entropy_steps=2, repeated_call=None)
    assert t.observe(Step("", ("a()",), 0.01)) is None
    assert t.observe(Step("", ("b()",), 0.02)).reason == "low_entropy"
    t = _tracker(low_entropy_steps=1, repeated_call=None)
    assert t.observe(Step("", ("a()",), math.nan)) is None


def test_a_runaway_loop_is_stopped_at_max_steps_and_saves_nothing():
    t = _tracker(max_steps=3, repeated_call=None, low_entropy_steps=None)
    assert t.observe(Step("", ("a()",))) is None and t.observe(Step("", ("b()",))) is None
    verdict = t.observe(Step("", ("c()",)))
    assert verdict.reason == "max_steps" and not verdict.converged
    assert steps_saved(verdict, 3, 3) == 0


def test_steps_saved_counts_the_budget_left():
    t = _tracker(max_steps=10)
    t.observe(Step("x", ("a()",)))
    verdict = t.observe(Step("x", ("b()",)))
    assert steps_saved(verdict, 2, 10) == 8


def test_a_step_reads_calls_and_peak_entropy_from_a_chat_reply():
    reply = AIMessage("", tool_calls=[{"name": "f", "args": {"x": 1}, "id": "1", "type": "tool_call"}],
                      response_metadata={"gravity": {"entropy": [0.2, 1.4, math.nan, 0.1]}})
    step = Step.of_message(reply)
    assert step.calls == ('f({"x":1})',) and step.entropy == pytest.approx(1.4)
    assert math.isnan(Step.of_message(AIMessage("hi")).entropy)


def test_low_entropy_is_off_by_default():
    t = _tracker(repeated_call=None)
    assert all(t.observe(Step("", (f"f{i}()",), 0.0)) is None for i in range(5))
