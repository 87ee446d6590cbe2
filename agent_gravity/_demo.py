"""The demo: short reasoning questions, each answered with gravity off and on, side by side."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig

QUESTIONS = (
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "A train travels 60 km per hour for 2 hours. How far does it go?",
    "If a shirt costs 20 dollars and is 25% off, what is the price?",
    "Sara has 12 cookies and eats 4. How many are left?",
)


@dataclass
class DemoRun:
    question: str
    mode: str
    answer: str
    tokens: int
    reasoning_tokens: int
    terminated_early: bool
    reason: str | None
    wall_s: float
    entropy: list[float]
    detail: str | None = None


def run_one(llm: ChatGravity, question: str, gravity: GravityConfig) -> DemoRun:
    """Answer one question and record what gravity did."""
    start = time.perf_counter()
    message = llm.invoke(question, gravity=gravity)
    wall = time.perf_counter() - start
    meta = message.response_metadata["gravity"]
    return DemoRun(
        question=question,
        mode="gravity" if gravity.enabled else "baseline",
        answer=str(message.content),
        tokens=message.usage_metadata["output_tokens"],
        reasoning_tokens=meta["reasoning_tokens"],
        terminated_early=meta["terminated_early"],
        reason=meta["reason"],
        wall_s=round(wall, 3),
        entropy=meta["entropy"],
        detail=meta["detail"],
    )


def run_demo(llm: ChatGravity, questions: tuple[str, ...] = QUESTIONS, on_run=lambda run: None) -> list[DemoRun]:
    """Run every question with gravity off, then on, on the same engine."""
    runs: list[DemoRun] = []
    for question in questions:
        for gravity in (llm.gravity.model_copy(update={"enabled": False}), llm.gravity.model_copy(update={"enabled": True})):
            runs.append(run_one(llm, question, gravity))
            on_run(runs[-1])
    return runs


def as_json(llm: ChatGravity, runs: list[DemoRun]) -> dict:
    backend = llm.get_backend()
    return {"backend": backend.provider, "model": backend.model_name,
            "runs": [{k: v for k, v in asdict(r).items() if k != "detail"} for r in runs]}


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def as_table(runs: list[DemoRun]) -> str:
    """A readable side-by-side table: one row per run, baseline above gravity."""
    header = f"{'question':<34} {'mode':<8} {'answer':<24} {'tokens':>6} {'reason.':>7} {'wall s':>6}  gravity"
    lines = [header, "-" * len(header)]
    for run in runs:
        fired = f"ended early: {run.detail}" if run.terminated_early else f"no ({run.reason})"
        question = _clip(run.question, 34) if run.mode == "baseline" else ""
        lines.append(f"{question:<34} {run.mode:<8} {_clip(run.answer, 24):<24} {run.tokens:>6} "
                     f"{run.reasoning_tokens:>7} {run.wall_s:>6.1f}  {fired}")
    base = [r for r in runs if r.mode == "baseline"]
    grav = [r for r in runs if r.mode == "gravity"]
    total_b, total_g = sum(r.tokens for r in base), sum(r.tokens for r in grav)
    lines.append("-" * len(header))
    lines.append(f"total tokens: baseline {total_b}, gravity {total_g} "
                 f"({(1 - total_g / total_b) * 100:.0f}% fewer); "
                 f"wall: baseline {sum(r.wall_s for r in base):.1f} s, gravity {sum(r.wall_s for r in grav):.1f} s")
    return "\n".join(lines)
