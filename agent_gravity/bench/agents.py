"""``agent-gravity bench agents``: the same create_agent tool agent with and without GravityMiddleware.

Both arms run the agent a developer would ship: ``create_agent`` with a calculator and a table
lookup, a ``FinalAnswer`` tool (LangChain's ToolStrategy, so every step is one forced tool call
and never free text) and LangChain's own call limit (``ModelCallLimitMiddleware``) as the
safeguard. The gravity arm adds GravityMiddleware with the same step budget. Both arms read the
final answer by one rule (see :func:`final_answer`), and each starts on a cold prefix cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agent_gravity._chat_model import ChatGravity
from agent_gravity._convergence import ConvergenceConfig
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench._stats import difference_ci, mean_ci, saving_ci, wilson
from agent_gravity.bench.agent_tasks import (
    SYSTEM_PROMPT,
    AgentTask,
    FinalAnswer,
    answer_number,
    calculator,
    lookup,
)

ARMS = ("baseline", "gravity")
GOAL = {"tokens_saved": 0.30, "calls_saved": 0.20, "agreement": 0.95}


def build_agent(model: ChatGravity, gravity: bool, max_steps: int = 8, low_entropy_steps: int | None = None) -> Any:
    """The benchmark's tool agent; ``gravity`` adds GravityMiddleware."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelCallLimitMiddleware
    from langchain.agents.structured_output import ToolStrategy

    from agent_gravity._middleware import GravityMiddleware

    converge = ConvergenceConfig(max_steps=max_steps, low_entropy_steps=low_entropy_steps)
    middleware: list[Any] = [GravityMiddleware(converge)] if gravity else []
    middleware.append(ModelCallLimitMiddleware(run_limit=max_steps, exit_behavior="end"))
    return create_agent(model, tools=[lookup, calculator], system_prompt=SYSTEM_PROMPT,
                        response_format=ToolStrategy(FinalAnswer), middleware=middleware)


def final_answer(state: dict[str, Any]) -> str:
    """The run's answer: its FinalAnswer, else the model's latest text, else the latest tool result."""
    if (structured := state.get("structured_response")) is not None:
        return str(structured.answer)
    gravity = state.get("gravity") or {}
    if gravity.get("reason") not in (None, "model_ended", "stopped_by_agent") and gravity.get("answer"):
        return gravity["answer"]  # gravity ended the run: its best answer, read by the rule below
    for message in reversed(state["messages"]):
        if isinstance(message, AIMessage) and message.usage_metadata and message.text.strip():
            return message.text.strip()
        if isinstance(message, ToolMessage) and message.status != "error":
            return message.text.strip()
    return ""


def _normal(answer: str) -> str:
    return answer_number(answer) or answer.strip().lower()


@dataclass
class TaskResult:
    """One task in one arm."""

    id: str
    answer: str
    correct: bool
    model_calls: int
    output_tokens: int
    total_tokens: int
    seconds: float
    reason: str | None


def run_task(agent: Any, task: AgentTask) -> TaskResult:
    """Run one task; model calls and tokens are read from the messages the model wrote."""
    start = time.perf_counter()
    state = agent.invoke({"messages": [HumanMessage(task.question)]})
    seconds = time.perf_counter() - start
    replies = [m for m in state["messages"] if isinstance(m, AIMessage) and m.usage_metadata]
    answer = final_answer(state)
    return TaskResult(task.id, answer, _normal(answer) == task.answer, len(replies),
                      sum(m.usage_metadata["output_tokens"] for m in replies),
                      sum(m.usage_metadata["total_tokens"] for m in replies), seconds,
                      (state.get("gravity") or {}).get("reason"))


def run_arm(agent: Any, tasks: Sequence[AgentTask], concurrency: int) -> list[TaskResult]:
    """Every task through one agent, ``concurrency`` at a time (the engine batches them)."""
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda t: run_task(agent, t), tasks))


def summarize(base: list[TaskResult], grav: list[TaskResult]) -> dict[str, Any]:
    """Per-arm means and the gravity arm's savings and agreement, each with its 95% interval."""
    arms = {}
    for name, results in zip(ARMS, (base, grav)):
        arms[name] = {
            "model_calls": mean_ci([r.model_calls for r in results]),
            "output_tokens": mean_ci([r.output_tokens for r in results]),
            "total_tokens": mean_ci([r.total_tokens for r in results]),
            "seconds": mean_ci([r.seconds for r in results]),
            "accuracy": wilson(sum(r.correct for r in results), len(results)),
        }
    reasons: dict[str, int] = {}
    for r in grav:
        reasons[r.reason or "none"] = reasons.get(r.reason or "none", 0) + 1
    # Two runs that both found no answer do not count as agreeing.
    agree = sum(bool(a.answer) and _normal(a.answer) == _normal(b.answer) for a, b in zip(base, grav))
    savings = {
        "calls_saved": saving_ci([r.model_calls for r in base], [r.model_calls for r in grav]),
        "tokens_saved": saving_ci([r.output_tokens for r in base], [r.output_tokens for r in grav]),
        "total_tokens_saved": saving_ci([r.total_tokens for r in base], [r.total_tokens for r in grav]),
        "seconds_saved": saving_ci([r.seconds for r in base], [r.seconds for r in grav]),
        "agreement": wilson(agree, len(base)),
        "accuracy_change": difference_ci([r.correct for r in base], [r.correct for r in grav]),
    }
    met = {k: savings[k]["value"] >= v for k, v in GOAL.items()}
    return {"arms": arms, "savings": savings, "reasons": reasons, "goal": {**met, "met": all(met.values())}}


def run(model: ChatGravity, tasks: Sequence[AgentTask], concurrency: int, max_steps: int,
        low_entropy_steps: int | None = None, on_arm: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Both arms over ``tasks``; the report with per-task results."""
    results = {}
    backend = model.get_backend()
    for arm in ARMS:
        on_arm(arm)
        # At temperature 0 the arms share their first steps: each starts on a cold prefix cache.
        if hasattr(backend, "reset_prefix_cache"):
            backend.reset_prefix_cache()
        agent = build_agent(model, arm == "gravity", max_steps, low_entropy_steps)
        results[arm] = run_arm(agent, tasks, concurrency)
    report = summarize(results["baseline"], results["gravity"])
    report["settings"] = {"tasks": len(tasks), "concurrency": concurrency, "max_steps": max_steps,
                          "low_entropy_steps": low_entropy_steps, "model": model.profile_key()}
    report["tasks"] = [{"task": t.to_dict(), **{a: asdict(results[a][i]) for a in ARMS}} for i, t in enumerate(tasks)]
    return report


def table(report: dict[str, Any]) -> str:
    """Arms side by side, then the savings, each with its 95% interval."""
    head = f"{'arm':<10} {'model calls':>20} {'output tok':>24} {'total tok':>26} {'s/task':>20} {'accuracy %':>20}"
    lines = [head, "-" * len(head)]
    for name, a in report["arms"].items():
        lines.append(f"{name:<10} {interval(a['model_calls'], 1, 2):>20} {interval(a['output_tokens']):>24} "
                     f"{interval(a['total_tokens'], 1, 0):>26} {interval(a['seconds'], 1, 2):>20} "
                     f"{interval(a['accuracy'], 100):>20}")
    s = report["savings"]
    lines.append(f"saved: calls {interval(s['calls_saved'], 100)} %, "
                 f"output tokens {interval(s['tokens_saved'], 100)} %, "
                 f"total tokens {interval(s['total_tokens_saved'], 100)} %, "
                 f"wall time {interval(s['seconds_saved'], 100)} %")
    lines.append(f"final-answer agreement {interval(s['agreement'], 100)} %, accuracy change "
                 f"{interval(s['accuracy_change'], 100)} points; gravity exits {report['reasons']}")
    g = report["goal"]
    verdicts = ", ".join(f"{k}: {v}" for k, v in g.items() if k != "met")
    lines.append(f"goal (>=30% tokens, >=20% calls, >=95% agreement): {'met' if g['met'] else 'not met'} ({verdicts})")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Bars of calls, tokens and seconds per task for both arms, with 95% intervals."""
    keys = ("model_calls", "output_tokens", "seconds")
    with figure(path, "bench agents: per task, 95% intervals", "", (10, 3.2), ncols=3) as axes:
        for ax, key in zip(axes, keys):
            for i, arm in enumerate(ARMS):
                f = report["arms"][arm][key]
                ax.bar(i, f["value"], yerr=[[f["value"] - f["lo"]], [f["hi"] - f["value"]]], label=arm, capsize=4)
            ax.set_title(key.replace("_", " "))
            ax.set_xticks([])
    return path


def main(model: ChatGravity, tasks: Sequence[AgentTask], concurrency: int, max_steps: int,
         low_entropy_steps: int | None, out_dir: Path, on_arm: Callable[[str], None]) -> dict[str, Any]:
    """Run the benchmark and write ``agents.json`` and ``agents.png`` under ``out_dir``."""
    report = run(model, tasks, concurrency, max_steps, low_entropy_steps, on_arm)
    write_json(out_dir / "agents.json", report)
    plot(report, out_dir / "agents.png")
    return report
