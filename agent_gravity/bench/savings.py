"""``agent-gravity bench savings``: tokens saved against answers kept, every method on the same engine.

Each method answers the same items through ChatGravity on one engine, one after another, at the same
concurrency. The full run (no early exit) is the reference for answer preservation; the task set's
ground truth gives accuracy. Probe tokens count as spent tokens. Every figure carries a 95% interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig, ProbeConfig
from agent_gravity._risk import Selection, learn_then_test
from agent_gravity._route import entropy_quantile
from agent_gravity.backends.base import Backend, GenerationRequest, StreamItem
from agent_gravity.bench import _stats
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench.tasks import Task, agrees, is_correct

FULL = "full"
DEFAULT = "default"
VLLM_BUDGET = "vllm_budget"
DYNASOR = "dynasor"
BASELINES = (FULL, VLLM_BUDGET, DYNASOR)
BUDGET = "reasoning_budget"
REFERENCE_SCALE = 4
"""Capped items are judged against a reference run with this many times the reasoning and answer budgets."""
OUTPUT_CAP = "length"
"""The finish reason of an output cut by its token budget."""


@dataclass(frozen=True)
class Budgets:
    """The reasoning and answer budgets every method of one run gets, the full run's cap included (the shipped
    defaults unless a reduced run asks for less)."""

    reasoning: int = GravityConfig.model_fields["max_reasoning_tokens"].default
    answer: int = GravityConfig.model_fields["max_answer_tokens"].default

    def apply(self, config: GravityConfig) -> GravityConfig:
        """``config`` with these budgets; pydantic's ValidationError for a budget it refuses."""
        return GravityConfig.model_validate({**config.model_dump(), "max_reasoning_tokens": self.reasoning,
                                             "max_answer_tokens": self.answer})

    def full(self) -> GravityConfig:
        """The full run's settings (gravity off) at these budgets."""
        return self.apply(GravityConfig(enabled=False))

    def apply_all(self, configs: dict[str, GravityConfig]) -> dict[str, GravityConfig]:
        """Every configuration of ``configs`` at these budgets, by name."""
        return {name: self.apply(config) for name, config in configs.items()}

    @classmethod
    def of(cls, config: dict[str, Any]) -> Budgets:
        """The budgets a run's stored configuration (``model_dump``) carried."""
        return cls(config["max_reasoning_tokens"], config["max_answer_tokens"])


def _only(policy: dict[str, Any] | None, probe: ProbeConfig | None = None,
          loop: dict[str, Any] | None = None) -> GravityConfig:
    return GravityConfig(policy=policy, probe=probe, loop=loop)


def method_configs(default: GravityConfig) -> dict[str, GravityConfig]:
    """Every method the benchmark can run, by name; ``vllm_budget`` runs with gravity off under vLLM's cap."""
    return {
        FULL: GravityConfig(enabled=False),
        # Each policy alone, at its own defaults (window_mean's are the concept write-up's 10 tokens, 1 nat).
        "window_mean": _only({"name": "window_mean"}),
        "ewma": _only({"name": "ewma"}),
        "cusum": _only({"name": "cusum"}),
        "loop": _only(None, loop={"name": "loop"}),
        "probe": _only({"name": "window_mean"}, ProbeConfig()),
        DEFAULT: default,
        VLLM_BUDGET: GravityConfig(enabled=False),
        # Dynasor-CoT: probe every 32 tokens, exit when the last 3 probe answers agree.
        DYNASOR: _only(None, ProbeConfig(interval=32, agree=3, gap=32, max_probes=8)),
    }


class ThinkingBudgetBackend:
    """A backend whose every request carries vLLM's fixed ``thinking_token_budget``."""

    def __init__(self, inner: Backend, budget: int) -> None:
        self._inner, self.budget = inner, budget

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # everything but the two stream methods is the inner backend's

    def _capped(self, request: GenerationRequest) -> GenerationRequest:
        sampling = dataclasses.replace(request.sampling, thinking_token_budget=self.budget)
        return dataclasses.replace(request, sampling=sampling)

    def stream(self, request: GenerationRequest) -> Iterator[StreamItem]:
        return self._inner.stream(self._capped(request))

    def astream(self, request: GenerationRequest) -> AsyncIterator[StreamItem]:
        return self._inner.astream(self._capped(request))


@dataclass
class ItemResult:
    id: str
    kind: str
    answer: str
    reasoning_tokens: int
    output_tokens: int
    probe_tokens: int
    probes: int
    seconds: float
    reason: str | None
    terminated_early: bool
    correct: bool
    lock_step: int | None = None
    probe_steps: tuple[int, ...] = ()
    probe_answers: tuple[str | None, ...] = ()
    """Each probe's comparable answer ('' for a hesitant one), in order, for the analysis of lost answers."""
    probe_confidence: tuple[float | None, ...] = ()
    prompt_tokens: int = 0
    route: dict[str, Any] | None = None
    """How the call was routed (``response_metadata["gravity"]["route"]``), when it was."""
    entropy_scores: dict[str, float | None] = dataclasses.field(default_factory=dict)
    """Summaries of the output's per-token entropy (see :func:`entropy_scores`), for routing analyses."""
    finish_reason: str | None = None
    """Why the output ended (``response_metadata["finish_reason"]``: ``"length"`` at the output cap)."""

    @property
    def capped(self) -> bool:
        """The run did not end by itself: it hit its reasoning budget, or its answer ran into the output cap (a
        repeating answer cut at an arbitrary point is no more a reference than a capped ramble)."""
        return self.rambled or self.finish_reason == OUTPUT_CAP

    @property
    def rambled(self) -> bool:
        """The run hit its reasoning budget instead of closing its reasoning itself."""
        return self.reason == BUDGET

    @property
    def spent(self) -> int:
        """Every generated token the answer cost, probes included."""
        return self.output_tokens + self.probe_tokens


def entropy_scores(entropy: Sequence[float], answer_tokens: int) -> dict[str, float | None]:
    """The output's entropy quantiles (q50, q90), max and mean, and the q90 of its answer tokens alone."""
    answer = entropy[len(entropy) - answer_tokens:] if answer_tokens else []
    finite = [e for e in entropy if e == e]
    return {"q50": entropy_quantile(entropy, 0.5), "q90": entropy_quantile(entropy, 0.9),
            "max": max(finite, default=None), "mean": sum(finite) / len(finite) if finite else None,
            "answer_q90": entropy_quantile(answer, 0.9)}


async def _answer(model: ChatGravity, task: Task, config: GravityConfig | None, gate: asyncio.Semaphore,
                  options: dict[str, Any]) -> ItemResult:
    async with gate:
        start = time.perf_counter()
        if config is not None:
            options = {**options, "gravity": config}
        message = await model.ainvoke([HumanMessage(task.question)], **options)
        seconds = time.perf_counter() - start
    g = message.response_metadata["gravity"]
    route = g.get("route")
    # a direct-answer probe that sent the call on to reason cost tokens the answer does not show
    probe_tokens = g["probe_tokens"] + (route["probe_tokens"] if route and route.get("route") == "reason"
                                        and "probe_tokens" in route else 0)
    return ItemResult(task.id, task.kind, message.content, g["reasoning_tokens"],
                      message.usage_metadata["output_tokens"], probe_tokens, g["probes"], seconds,
                      g["reason"], g["terminated_early"], is_correct(task, message.content), g["lock_step"],
                      tuple(g["probe_steps"]), tuple(g["probe_answers"]), tuple(g["probe_confidence"]),
                      message.usage_metadata["input_tokens"], route,
                      entropy_scores(g["entropy"], g["answer_tokens"]), message.response_metadata["finish_reason"])


def run_method(model: ChatGravity, tasks: Sequence[Task], config: GravityConfig | None,
               concurrency: int, **options: Any) -> tuple[list[ItemResult], float]:
    """Answer every task with ``config`` (None: the model's own) and per-call ``options``; return the per-item
    results and the wall time of the whole set."""
    async def run() -> list[ItemResult]:
        gate = asyncio.Semaphore(concurrency)
        return list(await asyncio.gather(*(_answer(model, t, config, gate, options) for t in tasks)))

    start = time.perf_counter()
    results = asyncio.run(run())
    return results, time.perf_counter() - start


def answer_lost(task: Task, full: ItemResult, result: ItemResult, reference: ItemResult | None = None) -> bool:
    """Whether an early exit lost the answer: the one real loss a reader can count.

    Where the full run ended by itself (reasoning closed, answer finished), any change of answer is a loss.
    Where it ran into a cap (reasoning budget, or the output cap in its answer) its answer is close to
    arbitrary, so only a real loss counts: a graded item the full run got right and
    this run gets wrong, or a free-text item whose full answer matched a settled longer-budget ``reference``
    that this run no longer matches.
    """
    if not full.capped:
        return not agrees(task, full.answer, result.answer)
    if task.answer is not None:
        return full.correct and not result.correct
    return (reference is not None and not reference.capped and agrees(task, reference.answer, full.answer)
            and not agrees(task, reference.answer, result.answer))


def _split_figures(tasks: Sequence[Task], full: list[ItemResult], results: list[ItemResult],
                   references: dict[str, ItemResult]) -> dict[str, Any]:
    """Answers kept where the full run settled (the headline), and capped items judged by accuracy and against
    the longer-budget reference."""
    settled = [i for i, f in enumerate(full) if not f.capped]
    capped = [i for i, f in enumerate(full) if f.capped]
    graded_capped = [i for i in capped if tasks[i].answer is not None]
    judged = [i for i in capped if tasks[i].id in references and not references[tasks[i].id].capped]
    rambles = [i for i, f in enumerate(full) if f.rambled]
    closed = [i for i, f in enumerate(full) if not f.rambled]
    lost = [answer_lost(tasks[i], full[i], results[i], references.get(tasks[i].id)) for i in range(len(tasks))]
    where = [results[i].reasoning_tokens / max(1, full[i].reasoning_tokens) for i in range(len(tasks)) if lost[i]]
    return {
        "lost_by_reason": dict(Counter(results[i].reason or "none" for i in range(len(tasks)) if lost[i])),
        # reasoning as long as the full run's: what changed is the answer itself (a loop stop cut a repeating answer)
        "lost_in_answer": sum(lost[i] and results[i].reasoning_tokens >= full[i].reasoning_tokens
                              for i in range(len(tasks))),
        "lost_exit_position": _stats.mean_ci(where),
        "lost_confidence": _stats.mean_ci([min(c for c in results[i].probe_confidence if c is not None)
                                           for i in range(len(tasks)) if lost[i]
                                           and any(c is not None for c in results[i].probe_confidence)]),
        "kept_settled": _stats.wilson(sum(agrees(tasks[i], full[i].answer, results[i].answer) for i in settled),
                                      len(settled)),
        "capped_accuracy_change": _stats.difference_ci([float(full[i].correct) for i in graded_capped],
                                                       [float(results[i].correct) for i in graded_capped]),
        "capped_kept_vs_reference": _stats.wilson(
            sum(agrees(tasks[i], references[tasks[i].id].answer, results[i].answer) for i in judged), len(judged)),
        "answer_loss": _stats.wilson(sum(lost), len(lost)),
        # where the saving comes from: reasoning the model closed itself cut short, or rambles that would have run
        # into the reasoning budget
        "reasoning_saved_settled": _stats.saving_ci([full[i].reasoning_tokens for i in closed],
                                                    [results[i].reasoning_tokens for i in closed]),
        "reasoning_saved_capped": _stats.saving_ci([full[i].reasoning_tokens for i in rambles],
                                                   [results[i].reasoning_tokens for i in rambles]),
        "capped_reasoning_share": sum(full[i].reasoning_tokens for i in rambles)
        / max(1, sum(f.reasoning_tokens for f in full)),
    }


def summarize(tasks: Sequence[Task], full: list[ItemResult], results: list[ItemResult],
              wall: float | None, references: dict[str, ItemResult] | None = None) -> dict[str, Any]:
    """Per-method figures with 95% intervals, preservation measured against the full run.

    With ``references`` (longer-budget runs of the items the full run capped, by id) the answers kept are also
    split by whether the full run settled, and the answer loss of :func:`answer_lost` is counted.
    """
    graded = [i for i, t in enumerate(tasks) if t.answer is not None]
    free = [i for i, t in enumerate(tasks) if t.answer is None]
    kept = [agrees(t, f.answer, r.answer) for t, f, r in zip(tasks, full, results)]
    summary = {
        "reasoning_tokens": _stats.mean_ci([r.reasoning_tokens for r in results]),
        "spent_tokens": _stats.mean_ci([r.spent for r in results]),
        "reasoning_saved": _stats.saving_ci([f.reasoning_tokens for f in full], [r.reasoning_tokens for r in results]),
        "spent_saved": _stats.saving_ci([f.spent for f in full], [r.spent for r in results]),
        "accuracy": _stats.wilson(sum(results[i].correct for i in graded), len(graded)),
        "accuracy_change": _stats.difference_ci([float(full[i].correct) for i in graded],
                                                [float(results[i].correct) for i in graded]),
        "preservation": _stats.wilson(sum(kept), len(kept)),
        "free_text_preservation": _stats.wilson(sum(kept[i] for i in free), len(free)),
        "seconds_per_item": _stats.mean_ci([r.seconds for r in results]),
        "probes_per_item": _stats.mean_ci([r.probes for r in results]),
        "probes_total": sum(r.probes for r in results),
        "early_exits": sum(r.terminated_early for r in results),
        "reasons": dict(Counter(r.reason or "none" for r in results)),
        "wall_seconds": wall,
    }
    if references is not None:
        summary.update(_split_figures(tasks, full, results, references))
    return summary


def reference_figures(tasks: Sequence[Task], full: list[ItemResult],
                      references: dict[str, ItemResult]) -> dict[str, Any]:
    """How stable the longer-budget reference of the capped items is: does it settle, does the capped run agree."""
    capped = [(t, f) for t, f in zip(tasks, full) if f.capped]
    settled = [(t, f) for t, f in capped if not references[t.id].capped]
    return {
        "settled_items": len(full) - len(capped),
        "capped_items": len(capped),
        # reasoning closed by the model, then the answer ran into the output cap
        "answer_capped_items": sum(not f.rambled for _, f in capped),
        "reference_settled": _stats.wilson(len(settled), len(capped)),
        "full_agrees_with_reference": _stats.wilson(
            sum(agrees(t, references[t.id].answer, f.answer) for t, f in settled), len(settled)),
        "reference_accuracy": _stats.wilson(sum(references[t.id].correct for t, _ in capped if t.answer is not None),
                                            sum(t.answer is not None for t, _ in capped)),
    }


def run_references(model: ChatGravity, tasks: Sequence[Task], full: list[ItemResult],
                   concurrency: int, budgets: Budgets = Budgets()) -> dict[str, ItemResult]:
    """Answer the items the full run capped again with ``REFERENCE_SCALE`` times the reasoning and answer
    budgets."""
    base = budgets.full()
    config = base.model_copy(update={"max_reasoning_tokens": base.max_reasoning_tokens * REFERENCE_SCALE,
                                     "max_answer_tokens": base.max_answer_tokens * REFERENCE_SCALE})
    capped = [t for t, f in zip(tasks, full) if f.capped]
    results, _ = run_method(model, capped, config, concurrency)
    return {r.id: r for r in results}


class Answers:
    """Every run of one experiment, by method name, aligned with ``tasks``; slices them by item indices."""

    def __init__(self, tasks: Sequence[Task], full: list[ItemResult], references: dict[str, ItemResult],
                 runs: dict[str, list[ItemResult]]) -> None:
        self.tasks, self.full, self.references, self.runs = list(tasks), full, references, runs

    def losses(self, method: str, idx: Sequence[int]) -> list[int]:
        """The 0/1 answer loss of ``method`` on the items ``idx``."""
        return [int(answer_lost(self.tasks[i], self.full[i], self.runs[method][i],
                                self.references.get(self.tasks[i].id))) for i in idx]

    def question_losses(self, method: str, idx: Sequence[int]) -> list[int]:
        """One 0/1 loss per question: 1 when ``method`` lost the answer to any of its wordings among ``idx``.

        Two wordings of one question are not independent draws, so risk control counts questions, and a
        question's loss is the worst of its wordings': its mean is an upper bound on the per-item loss.
        """
        worst: dict[str, int] = {}
        for i, lost in zip(idx, self.losses(method, idx), strict=True):
            key = self.tasks[i].pair or self.tasks[i].id
            worst[key] = max(worst.get(key, 0), lost)
        return list(worst.values())

    def saving(self, method: str, idx: Sequence[int]) -> float:
        """Share of the full run's reasoning tokens ``method`` saved on ``idx``."""
        full = sum(self.full[i].reasoning_tokens for i in idx)
        return 1 - sum(self.runs[method][i].reasoning_tokens for i in idx) / full if full else 0.0

    def summary(self, method: str, idx: Sequence[int]) -> dict[str, Any]:
        """:func:`summarize` of ``method`` on ``idx``; wall time is not split by item, so it is None."""
        tasks, full, runs = ([rows[i] for i in idx] for rows in (self.tasks, self.full, self.runs[method]))
        return summarize(tasks, full, runs, None, self.references)

    def select(self, candidates: Sequence[str], idx: Sequence[int], epsilon: float, delta: float) -> Selection:
        """Learn-then-Test over ``candidates`` (most conservative first) on the questions of the items ``idx``."""
        return learn_then_test([(c, self.question_losses(c, idx), self.saving(c, idx)) for c in candidates],
                               epsilon, delta)


def goal(methods: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The issue's bar for the composed default, checked on the measured figures."""
    d = methods.get(DEFAULT)
    if d is None or FULL not in methods:
        return {"checked": False, "why": "needs the full and default methods in one run"}
    dominated_by = [name for name in BASELINES if name in methods and name != FULL
                    and methods[name]["spent_tokens"]["value"] < d["spent_tokens"]["value"]
                    and methods[name]["accuracy"]["value"] > d["accuracy"]["value"]]
    checks = {
        "reasoning_saved_at_least_40pct": d["reasoning_saved"]["value"] >= 0.40,
        "preservation_at_least_95pct": d["preservation"]["value"] >= 0.95,
        "accuracy_loss_at_most_1pt": d["accuracy_change"]["value"] >= -0.01,
        "no_baseline_better_on_tokens_and_accuracy": not dominated_by,
    }
    return {"checked": True, **checks, "met": all(checks.values()), "dominated_by": dominated_by}


def run(model: ChatGravity, tasks: Sequence[Task], names: Sequence[str], concurrency: int,
        budget_backend: Callable[[int], Backend],
        on_method: Callable[[str, dict], None] = lambda n, s: None, budgets: Budgets = Budgets()) -> dict[str, Any]:
    """Run the methods in order (full first, vllm_budget after default) and report them side by side."""
    configs = budgets.apply_all(method_configs(GravityConfig()))
    unknown = set(names) - set(configs)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {sorted(configs)}")
    order = [FULL, *[n for n in configs if n in names and n not in (FULL, VLLM_BUDGET)]]
    if VLLM_BUDGET in names:
        if DEFAULT not in names:
            raise ValueError("vllm_budget is set to the default run's mean reasoning length: add 'default'")
        order.append(VLLM_BUDGET)
    _warm(model, tasks, concurrency)
    report: dict[str, Any] = {"model": model.get_backend().model_name, "items": len(tasks),
                              "free_text_items": sum(t.answer is None for t in tasks),
                              "concurrency": concurrency, "methods": {}, "per_item": {}, "configs": {}}
    results: dict[str, list[ItemResult]] = {}
    for name in order:
        runner, config = model, configs[name]
        if name == VLLM_BUDGET:
            budget = max(1, round(report["methods"][DEFAULT]["reasoning_tokens"]["value"]))
            runner = ChatGravity(backend=budget_backend(budget), gravity=model.gravity)
            report["vllm_thinking_token_budget"] = budget
        results[name], wall = run_method(runner, tasks, config, concurrency)
        report["methods"][name] = summarize(tasks, results[FULL], results[name], wall)
        report["per_item"][name] = [dataclasses.asdict(r) for r in results[name]]
        report["configs"][name] = config.model_dump(mode="json")
        on_method(name, report["methods"][name])
    report["goal"] = goal(report["methods"])
    return report


def _warm(model: ChatGravity, tasks: Sequence[Task], concurrency: int) -> None:
    """Fill the prefix cache with every prompt first, so no method pays for prefill the others skip."""
    config = GravityConfig(enabled=False, max_reasoning_tokens=1, max_answer_tokens=1, min_tokens=0)
    run_method(model, tasks, config, concurrency)


def table(report: dict[str, Any]) -> str:
    """One row per method: tokens, savings, accuracy, preservation and probes, each with its 95% interval."""
    head = (f"{'method':<12} {'reasoning tok':>22} {'saved %':>22} {'spent tok':>22} {'accuracy %':>20} "
            f"{'preserved %':>22} {'s/item':>18} {'probes':>7}")
    lines = [head, "-" * len(head)]
    for name, m in report["methods"].items():
        lines.append(f"{name:<12} {interval(m['reasoning_tokens']):>22} {interval(m['reasoning_saved'], 100):>22} "
                     f"{interval(m['spent_tokens']):>22} {interval(m['accuracy'], 100):>20} "
                     f"{interval(m['preservation'], 100):>22} "
                     f"{interval(m['seconds_per_item'], 1, 2):>18} {m['probes_total']:>7}")
    g = report["goal"]
    if g.get("checked"):
        verdicts = ", ".join(f"{k}: {'yes' if g[k] else 'NO'}" for k in g
                             if k not in ("checked", "met", "dominated_by"))
        lines.append(f"goal for '{DEFAULT}': {'met' if g['met'] else 'not met'} ({verdicts})")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Spent tokens against accuracy and against preservation, one point with error bars per method."""
    title = f"savings: {report['model']}, {report['items']} items"
    with figure(path, title, "", (11, 4.2), ncols=2) as axes:
        for ax, key, label in ((axes[0], "accuracy", "accuracy (%)"), (axes[1], "preservation",
                                                                       "answers kept vs full run (%)")):
            for name, m in report["methods"].items():
                x, y = m["spent_tokens"], m[key]
                ax.errorbar(x["value"], 100 * y["value"], xerr=[[x["value"] - x["lo"]], [x["hi"] - x["value"]]],
                            yerr=[[100 * (y["value"] - y["lo"])], [100 * (y["hi"] - y["value"])]],
                            fmt="s" if name in BASELINES else "o", capsize=3, label=name)
            ax.set_xlabel("generated tokens per item, probes included")
            ax.set_ylabel(label)
    return path


def main(model: ChatGravity, tasks: Sequence[Task], names: Sequence[str], concurrency: int,
         budget_backend: Callable[[int], Backend], out_dir: Path,
         on_method: Callable[[str, dict], None], budgets: Budgets = Budgets()) -> dict[str, Any]:
    """Run the benchmark and write ``savings.json`` and ``savings.png`` under ``out_dir``."""
    report = run(model, tasks, names, concurrency, budget_backend, on_method, budgets)
    write_json(out_dir / "savings.json", report)
    plot(report, out_dir / "savings.png")
    return report
