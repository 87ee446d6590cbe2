"""Surface: GravityMiddleware, gravity for LangChain v1 agents (``langchain.agents.create_agent``).

Needs the ``agents`` extra (``pip install 'agent-gravity[agents]'``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NotRequired

from langchain.agents import AgentState
from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse, hook_config
from langchain.agents.middleware.types import ToolCallRequest
from langchain.agents.middleware.types import PrivateStateAttr
from langchain_core.messages import AIMessage, ToolCall, ToolMessage

from agent_gravity._config import GravityConfig, TelemetryConfig
from agent_gravity._convergence import ConvergenceConfig, ConvergenceTracker, Step, Verdict
from agent_gravity.telemetry._spans import tool_span


class GravityAgentState(AgentState):
    """Agent state with gravity's outcome: ``gravity`` holds the answer, the reason and the step count."""

    gravity: NotRequired[dict[str, Any]]
    gravity_steps: NotRequired[Annotated[list[dict[str, Any]], PrivateStateAttr]]


class GravityMiddleware(AgentMiddleware):
    """End an agent run once its steps have converged, and stop runaway loops with a clear reason.

    ``gravity`` (optional) overrides the ChatGravity model's GravityConfig on every model call.
    After each model call the step is compared with the run's earlier steps (see
    ConvergenceConfig); on convergence the run jumps to its end: the pending tool calls are
    answered as not run, and a final AIMessage carries the best answer. The final state's
    ``gravity`` key holds ``{"answer", "reason", "detail", "steps", "converged"}``; a run gravity
    did not end reports ``model_ended`` (the model answered, or gave its structured response) or
    ``stopped_by_agent`` (another middleware, such as a call limit, ended it).
    """

    state_schema = GravityAgentState

    def __init__(self, converge: ConvergenceConfig | None = None, gravity: GravityConfig | None = None,
                 telemetry: TelemetryConfig | None = None) -> None:
        super().__init__()
        self.converge = converge or ConvergenceConfig()
        self.gravity = gravity
        self.telemetry = telemetry or TelemetryConfig()

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Any]) -> Any:
        """Run one tool call under an ``execute_tool {name}`` span (in ``telemetry``'s span mode)."""
        with tool_span(self.telemetry, request.tool_call["name"], request.tool_call.get("id")):
            return handler(request)

    async def awrap_tool_call(self, request: ToolCallRequest,
                              handler: Callable[[ToolCallRequest], Awaitable[Any]]) -> Any:
        """Async form of :meth:`wrap_tool_call`."""
        with tool_span(self.telemetry, request.tool_call["name"], request.tool_call.get("id")):
            return await handler(request)

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> ModelResponse:
        """Run the model call with this middleware's GravityConfig, when it has one."""
        return handler(self._request(request))

    async def awrap_model_call(self, request: ModelRequest,
                               handler: Callable[[ModelRequest], Awaitable[ModelResponse]]) -> ModelResponse:
        """Async form of :meth:`wrap_model_call`."""
        return await handler(self._request(request))

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: GravityAgentState, runtime: Any) -> dict[str, Any] | None:
        """Judge the step just taken; end the run when the agent has converged or runs away."""
        # The step's reply is the latest AI message (a structured response adds a tool message after it).
        message = next((m for m in reversed(state["messages"]) if isinstance(m, AIMessage)), None)
        if message is None:
            return None
        tracker = self._tracker(state)
        # Calls the model node already answered (a structured response) do not continue the run.
        answered = {m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)}
        pending = [c for c in message.tool_calls if c["id"] not in answered]
        step = Step.of_message(message.model_copy(update={"tool_calls": pending}))
        steps = [*state.get("gravity_steps", []), dataclasses.asdict(step)]
        verdict = tracker.observe(step)
        if verdict is None:
            return {"gravity_steps": steps}
        return {"gravity_steps": steps, "jump_to": "end", "gravity": _outcome(verdict),
                "messages": _closing_messages(pending, verdict)}

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: GravityAgentState, runtime: Any) -> dict[str, Any] | None:
        """Async form of :meth:`after_model`."""
        return self.after_model(state, runtime)

    def before_agent(self, state: GravityAgentState, runtime: Any) -> dict[str, Any] | None:
        """Start the run's record afresh (a thread's state outlives its runs; a resumed run keeps its own)."""
        return {"gravity": None, "gravity_steps": []}

    def after_agent(self, state: GravityAgentState, runtime: Any) -> dict[str, Any] | None:
        """Record how a run that gravity did not end, ended: by the model's answer or by another middleware."""
        if state.get("gravity") is not None:
            return None
        last, steps = state["messages"][-1], state.get("gravity_steps", [])
        # The model ended the run when its last step is the final message (a limit appends its own).
        by_model = state.get("structured_response") is not None or bool(
            isinstance(last, AIMessage) and not last.tool_calls and steps and not steps[-1]["calls"]
            and steps[-1]["answer"] == last.text.strip())
        answer = state.get("structured_response")
        if answer is None:
            answer = last.text.strip() if by_model else self._tracker(state).best_answer()
        return {"gravity": {"answer": answer, "reason": "model_ended" if by_model else "stopped_by_agent",
                            "detail": None, "steps": len(steps), "converged": by_model}}

    def _request(self, request: ModelRequest) -> ModelRequest:
        if self.gravity is None:
            return request
        return request.override(model_settings={**request.model_settings, "gravity": self.gravity})

    def _tracker(self, state: GravityAgentState) -> ConvergenceTracker:
        """The run's tracker, rebuilt from the state (a middleware instance serves many runs)."""
        tracker = ConvergenceTracker(self.converge)
        tracker.steps = [Step(**s) for s in state.get("gravity_steps", [])]
        start = _run_start(state["messages"], len(tracker.steps))
        for m in state["messages"][start:]:
            if isinstance(m, ToolMessage):
                tracker.tool_result(m)
        return tracker


def _run_start(messages: list[Any], steps: int) -> int:
    """Index of this run's first AI message (its tool results all come after it)."""
    ai = [i for i, m in enumerate(messages) if isinstance(m, AIMessage)]
    return ai[-(steps + 1)] if steps + 1 <= len(ai) else 0


def _outcome(verdict: Verdict) -> dict[str, Any]:
    return {"answer": verdict.answer, "reason": verdict.reason, "detail": verdict.detail,
            "steps": verdict.step, "converged": verdict.converged}


def _closing_messages(pending: list[ToolCall], verdict: Verdict) -> list[Any]:
    """Answer every pending tool call as not run, then give the best answer as the final message."""
    why = "the agent converged" if verdict.converged else "the agent loop was stopped as a runaway"
    skipped = [ToolMessage(content=f"Not run: {why} ({verdict.detail}).", tool_call_id=c["id"], name=c["name"],
                           status="error") for c in pending]
    final = AIMessage(content=verdict.answer, response_metadata={"gravity_agent": _outcome(verdict)})
    return [*skipped, final]
