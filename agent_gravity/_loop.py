"""Surface: ``@gravity_loop``, convergence for hand-written agent loops, sync and async.

::

    @gravity_loop(max_steps=8)
    def solve(question: str, loop: AgentLoop) -> str | None:
        messages = [HumanMessage(question)]
        for _ in loop:                          # ends by itself once the loop has converged
            reply = loop.step(model.invoke(messages))
            if not reply.tool_calls:
                return reply.text               # the model answered: the loop is done
            messages += [reply, *(loop.call_tool(TOOLS[c["name"]], c) for c in reply.tool_calls)]
        return None                             # converged or stopped: the tracker's best answer is used

    result = solve("What is 6 * 7?")            # LoopResult(answer, reason, steps, steps_saved, ...)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from pydantic import BaseModel, ConfigDict

from agent_gravity._convergence import ConvergenceConfig, ConvergenceTracker, Step, Verdict, steps_saved
from agent_gravity._config import TelemetryConfig
from agent_gravity.telemetry._spans import GRAVITY_PREFIX, agent_span, set_attributes, tool_span


class LoopResult(BaseModel):
    """How a gravity loop ended."""

    model_config = ConfigDict(frozen=True)

    answer: Any
    """What the loop function returned; when it returned None after the loop was ended (converged or
    stopped), the best answer the tracker holds."""
    reason: str
    """``model_ended`` (the function returned), or the convergence reason (``same_answer``,
    ``repeated_tool_call``, ``low_entropy``), or ``max_steps`` for a runaway loop."""
    detail: str | None
    steps: int
    steps_saved: int
    """Steps left in ``max_steps`` when a converged loop ended; 0 for a loop that was not cut."""


class AgentLoop:
    """The loop's handle: iterate it for steps, report each model reply and tool call through it."""

    def __init__(self, config: ConvergenceConfig, telemetry: TelemetryConfig | None = None) -> None:
        self.config = config
        self.telemetry = telemetry or TelemetryConfig()
        self.tracker = ConvergenceTracker(config)
        self.verdict: Verdict | None = None

    def __iter__(self) -> Iterator[int]:
        """Step numbers from 1; stops once a verdict is in or ``max_steps`` is reached."""
        step = 0
        while self.verdict is None and step < self.config.max_steps:
            step += 1
            yield step

    def step(self, reply: AIMessage | str) -> AIMessage:
        """Record a step's model reply (a ChatGravity reply also gives its entropy)."""
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=reply)
        self.verdict = self.verdict or self.tracker.observe(Step.of_message(message))
        return message

    def call_tool(self, tool: Any, call: ToolCall) -> ToolMessage:
        """Run a LangChain tool for ``call`` under an ``execute_tool`` span, and record its result."""
        with tool_span(self.telemetry, call["name"], call.get("id")):
            return self._tool_result(tool.invoke(call), call)

    async def acall_tool(self, tool: Any, call: ToolCall) -> ToolMessage:
        """Async form of :meth:`call_tool`."""
        with tool_span(self.telemetry, call["name"], call.get("id")):
            return self._tool_result(await tool.ainvoke(call), call)

    def _tool_result(self, result: Any, call: ToolCall) -> ToolMessage:
        message = result if isinstance(result, ToolMessage) else ToolMessage(
            content=str(result), tool_call_id=call["id"], name=call["name"])
        self.tracker.tool_result(message)
        return message

    def result(self, returned: Any) -> LoopResult:
        """The loop's outcome, given what its function returned."""
        steps = len(self.tracker.steps)
        verdict = self.verdict
        if verdict is None and returned is None and steps >= self.config.max_steps:
            verdict = self.tracker.runaway()
        if verdict is None:
            return LoopResult(answer=returned, reason="model_ended", detail=None, steps=steps, steps_saved=0)
        # Tool calls the function ran after the verdict count: the best answer is read now.
        answer = returned if returned is not None else self.tracker.best_answer()
        return LoopResult(answer=answer, reason=verdict.reason, detail=verdict.detail, steps=steps,
                          steps_saved=steps_saved(verdict, steps, self.config.max_steps))


def gravity_loop(max_steps: int | None = None, converge: ConvergenceConfig | None = None,
                 name: str | None = None,
                 telemetry: TelemetryConfig | None = None) -> Callable[[Callable[..., Any]], Callable[..., LoopResult]]:
    """Decorate an agent loop function that takes ``loop: AgentLoop``; calling it returns a LoopResult.

    The function iterates ``loop``, reports each reply with ``loop.step`` and runs tools with
    ``loop.call_tool``. Iteration ends once the steps converge or ``max_steps`` (default: the
    ``converge`` config's, 12) is reached. The
    run is one ``invoke_agent {name}`` span; model and tool calls nest under it. Works on
    ``def`` and ``async def`` functions alike. ``telemetry`` chooses the span mode (default: TelemetryConfig()).
    """
    config = converge or ConvergenceConfig()
    if max_steps is not None:  # validated like any other setting
        config = ConvergenceConfig(**{**config.model_dump(), "max_steps": max_steps})

    def decorate(fn: Callable[..., Any]) -> Callable[..., LoopResult]:
        if "loop" not in inspect.signature(fn).parameters:
            raise TypeError(f"{fn.__qualname__} must take a `loop` parameter (the AgentLoop that @gravity_loop "
                            "passes in)")
        agent = name or fn.__name__

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def arun(*args: Any, **kwargs: Any) -> LoopResult:
                loop = AgentLoop(config, telemetry)
                with agent_span(loop.telemetry, agent) as span:
                    result = loop.result(await fn(*args, loop=loop, **kwargs))
                    set_attributes(span, _span_attributes(result))
                return result
            return arun

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> LoopResult:
            loop = AgentLoop(config, telemetry)
            with agent_span(loop.telemetry, agent) as span:
                result = loop.result(fn(*args, loop=loop, **kwargs))
                set_attributes(span, _span_attributes(result))
            return result
        return run

    return decorate


def _span_attributes(result: LoopResult) -> dict[str, Any]:
    return {GRAVITY_PREFIX + "agent.reason": result.reason, GRAVITY_PREFIX + "agent.steps": result.steps,
            GRAVITY_PREFIX + "agent.steps_saved": result.steps_saved}
