"""``bench savings --split leave-one-family-out``: calibrate on every family but one, report on the one left out.

Every method and calibration candidate answers every item once; the split is bookkeeping over those
answers. For each family, risk-controlled calibration (:mod:`agent_gravity._risk`) sees only the other
families' items and picks a candidate; the held-out family's items then measure what that choice does on
questions worded unlike anything it was calibrated on. The report gives every family, the worst one and
the mean, the shipped default and the baselines on the same families, and a paraphrase check.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent_gravity._calibrate import GRID, Candidate, candidates
from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig
from agent_gravity._risk import check_levels
from agent_gravity.backends.base import Backend
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench.savings import (
    DEFAULT,
    DYNASOR,
    FULL,
    VLLM_BUDGET,
    Answers,
    _warm,
    method_configs,
    reference_figures,
    run_method,
    run_references,
    summarize,
)
from agent_gravity.bench.tasks import Task

GOAL = {"kept_settled": 0.95, "reasoning_saved": 0.35, "mean_reasoning_saved": 0.40, "accuracy_change": -0.01}


@dataclass(frozen=True)
class Fold:
    """One family held out: the indices calibration may see, and those it is judged on."""

    family: str
    calibration: tuple[int, ...]
    evaluation: tuple[int, ...]


def folds(tasks: Sequence[Task]) -> list[Fold]:
    """One fold per family (a task's ``kind``), in first-seen order; ValueError with fewer than two families."""
    families = list(dict.fromkeys(t.kind for t in tasks))
    if len(families) < 2:
        raise ValueError(f"leave-one-family-out needs at least two task families, got {families}")
    return [Fold(f, tuple(i for i, t in enumerate(tasks) if t.kind != f),
                 tuple(i for i, t in enumerate(tasks) if t.kind == f)) for f in families]


def _meets(s: dict[str, Any]) -> dict[str, bool]:
    return {"kept_settled": s["kept_settled"]["value"] >= GOAL["kept_settled"],
            "no_capped_accuracy_loss": not s["capped_accuracy_change"]["value"] < 0,
            "accuracy_loss_at_most_1pt": s["accuracy_change"]["value"] >= GOAL["accuracy_change"],
            "reasoning_saved": s["reasoning_saved"]["value"] >= GOAL["reasoning_saved"]}


def leave_one_family_out(answers: Answers, candidates: Sequence[str], fallback: str, epsilon: float,
                         delta: float, compared: Sequence[str] = ()) -> dict[str, Any]:
    """Calibrate on all families but one, evaluate the choice on the one left out, for every family.

    ``fallback`` is the configuration kept when no candidate meets the bound; ``compared`` are methods reported
    on each held-out family beside the calibrated choice (the shipped default, the baselines).
    """
    rows = []
    for fold in folds(answers.tasks):
        selection = answers.select(candidates, fold.calibration, epsilon, delta)
        chosen = selection.chosen or fallback
        held = answers.summary(chosen, fold.evaluation)
        loss = held["answer_loss"]["value"]
        rows.append({
            "family": fold.family, "items": len(fold.evaluation), "calibration_items": len(fold.calibration),
            "calibration_families": sorted({answers.tasks[i].kind for i in fold.calibration}),
            "chosen": chosen, "bound_met": selection.met,
            "bound": selection.test(selection.chosen).bound if selection.chosen else None,
            "tests": [t.__dict__ for t in selection.tests],
            "held_out": held, "loss_within_epsilon": loss <= epsilon, "goal": _meets(held),
            "compared": {m: answers.summary(m, fold.evaluation) for m in compared},
        })
    return {"epsilon": epsilon, "delta": delta, "candidates": list(candidates), "fallback": fallback,
            "families": rows, "worst": _worst(rows), "mean": _mean(rows),
            "goal": _goal(rows)}


def _worst(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def by(key: str) -> dict[str, Any]:
        row = min(rows, key=lambda r: r["held_out"][key]["value"])
        return {"family": row["family"], "value": row["held_out"][key]["value"]}

    return {"kept_settled": by("kept_settled"), "reasoning_saved": by("reasoning_saved"),
            "accuracy_change": by("accuracy_change"),
            "answer_loss": max(({"family": r["family"], "value": r["held_out"]["answer_loss"]["value"]} for r in rows),
                               key=lambda x: x["value"])}


def _mean(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("kept_settled", "reasoning_saved", "accuracy_change", "answer_loss")
    return {k: float(np.nanmean([r["held_out"][k]["value"] for r in rows])) for k in keys}


def _goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_family = {r["family"]: all(r["goal"].values()) for r in rows}
    mean_saved = float(np.mean([r["held_out"]["reasoning_saved"]["value"] for r in rows]))
    checks = {"every_family": all(per_family.values()), "mean_saving_at_least_40pct": mean_saved >= 0.40,
              "bound_holds_on_every_family": all(r["loss_within_epsilon"] for r in rows)}
    return {**checks, "met": all(checks.values()), "families_missing": [f for f, ok in per_family.items() if not ok]}


def paraphrase_check(answers: Answers, method: str, seed: int = 0, resamples: int = 2000) -> dict[str, Any]:
    """Does the wording change whether ``method`` keeps the answer? Discordant twin pairs against chance.

    Each pair of twins (same question, two wordings) is discordant when one keeps its answer and the other
    loses it. Chance is the discordance of random pairs within the same family; the p-value is the share of
    random re-pairings at least as discordant as the real pairs (small: wording matters more than chance).
    """
    kept = {t.id: 1 - answers.losses(method, [i])[0] for i, t in enumerate(answers.tasks)}
    pairs: dict[tuple[str, str], list[str]] = defaultdict(list)
    for t in answers.tasks:
        if t.pair is not None:
            pairs[(t.kind, t.pair)].append(t.id)
    twins = [ids for ids in pairs.values() if len(ids) == 2]
    if not twins:
        return {"pairs": 0}
    observed = float(np.mean([kept[a] != kept[b] for a, b in twins]))
    rng = np.random.default_rng(seed)
    by_family: dict[str, list[int]] = defaultdict(list)
    for (family, _), ids in pairs.items():
        if len(ids) == 2:
            by_family[family].extend(kept[i] for i in ids)
    shuffled = []
    for _ in range(resamples):
        discordant = 0
        for values in by_family.values():
            v = rng.permutation(values)
            discordant += int(np.sum(v[0::2] != v[1::2]))
        shuffled.append(discordant / len(twins))
    chance = float(np.mean(shuffled))
    return {"pairs": len(twins), "discordant": observed, "chance": chance,
            "p_value": float(np.mean([s >= observed for s in shuffled])),
            "discordant_pairs": int(round(observed * len(twins)))}


def table(report: dict[str, Any]) -> str:
    """One row per held-out family (the calibrated choice), then the worst, the mean and the verdict."""
    split = report["split"]
    head = (f"{'held out':<15} {'chosen':<10} {'kept (settled) %':>22} {'capped acc Δ pt':>22} "
            f"{'acc Δ pt':>20} {'reasoning saved %':>22} {'loss %':>7} {'bound %':>8}")
    lines = [f"leave-one-family-out, epsilon {split['epsilon']}, delta {split['delta']}", head, "-" * len(head)]
    for r in split["families"]:
        h = r["held_out"]
        bound = f"{100 * r['bound']:.1f}" if r["bound"] is not None else "none"
        lines.append(f"{r['family']:<15} {r['chosen']:<10} {interval(h['kept_settled'], 100):>22} "
                     f"{interval(h['capped_accuracy_change'], 100):>22} {interval(h['accuracy_change'], 100):>20} "
                     f"{interval(h['reasoning_saved'], 100):>22} {100 * h['answer_loss']['value']:>7.1f} {bound:>8}")
    w, m = split["worst"], split["mean"]
    lines.append(f"worst family: kept {100 * w['kept_settled']['value']:.1f}% ({w['kept_settled']['family']}), "
                 f"saved {100 * w['reasoning_saved']['value']:.1f}% ({w['reasoning_saved']['family']}), "
                 f"loss {100 * w['answer_loss']['value']:.1f}% ({w['answer_loss']['family']})")
    lines.append(f"mean: kept {100 * m['kept_settled']:.1f}%, saved {100 * m['reasoning_saved']:.1f}%, "
                 f"accuracy {100 * m['accuracy_change']:+.1f} pt, loss {100 * m['answer_loss']:.1f}%")
    for name in split["families"][0]["compared"]:
        kept = [r["compared"][name]["kept_settled"]["value"] for r in split["families"]]
        saved = [r["compared"][name]["reasoning_saved"]["value"] for r in split["families"]]
        lines.append(f"{name:<12} worst kept {100 * min(kept):.1f}%, mean kept {100 * float(np.nanmean(kept)):.1f}%, "
                     f"worst saved {100 * min(saved):.1f}%, mean saved {100 * float(np.mean(saved)):.1f}%")
    p = report.get("paraphrase", {})
    if p.get("pairs"):
        lines.append(f"paraphrases ({p['method']}): {p['discordant_pairs']} of {p['pairs']} twin pairs differ in "
                     f"whether the answer is kept ({100 * p['discordant']:.1f}% against {100 * p['chance']:.1f}% "
                     f"by chance, p = {p['p_value']:.2f})")
    g = split["goal"]
    lines.append(f"goal: {'met' if g['met'] else 'not met'} (every family: {g['every_family']}, "
                 f"mean saving >= 40%: {g['mean_saving_at_least_40pct']}, bound holds on every family: "
                 f"{g['bound_holds_on_every_family']}; missing: {g['families_missing']})")
    return "\n".join(lines)


def run(model: ChatGravity, tasks: Sequence[Task], concurrency: int, budget_backend: Callable[[int], Backend],
        epsilon: float, delta: float, grid: Sequence[Candidate] = GRID,
        on_method: Callable[[str, dict], None] = lambda n, s: None) -> dict[str, Any]:
    """Answer every item with the full run, the references of capped items, every grid candidate and the
    baselines (Dynasor-style probing, vLLM's budget at the default's mean reasoning length); then split."""
    check_levels(epsilon, delta)
    configs = {**candidates(GravityConfig(), grid), DYNASOR: method_configs(GravityConfig())[DYNASOR]}
    _warm(model, tasks, concurrency)
    full, wall = run_method(model, tasks, GravityConfig(enabled=False), concurrency)
    references = run_references(model, tasks, full, concurrency)
    runs, walls = {FULL: full}, {FULL: wall}
    for name, config in configs.items():
        runs[name], walls[name] = run_method(model, tasks, config, concurrency)
        on_method(name, summarize(tasks, full, runs[name], walls[name], references))
    budget = max(1, round(sum(r.reasoning_tokens for r in runs[DEFAULT]) / len(tasks)))
    capped_model = ChatGravity(backend=budget_backend(budget), gravity=model.gravity)
    runs[VLLM_BUDGET], walls[VLLM_BUDGET] = run_method(capped_model, tasks, GravityConfig(enabled=False), concurrency)
    on_method(VLLM_BUDGET, summarize(tasks, full, runs[VLLM_BUDGET], walls[VLLM_BUDGET], references))
    answers = Answers(tasks, full, references, runs)
    baselines = [DYNASOR, VLLM_BUDGET]
    report: dict[str, Any] = {
        "model": model.get_backend().model_name, "items": len(tasks), "concurrency": concurrency,
        "families": sorted({t.kind for t in tasks}), "vllm_thinking_token_budget": budget,
        "reference": reference_figures(tasks, full, references),
        "methods": {n: summarize(tasks, full, r, walls[n], references) for n, r in runs.items()},
        "by_family": {f.family: {n: answers.summary(n, f.evaluation) for n in runs} for f in folds(tasks)},
        "configs": {n: c.model_dump(mode="json") for n, c in configs.items()},
        "split": leave_one_family_out(answers, [c.name for c in grid], DEFAULT, epsilon, delta,
                                      [DEFAULT, *baselines]),
        "paraphrase": {"method": DEFAULT, **paraphrase_check(answers, DEFAULT)},
        "per_item": {n: [dataclasses.asdict(r) for r in rs] for n, rs in runs.items()},
        "references": {k: dataclasses.asdict(r) for k, r in references.items()},
    }
    return report


def plot(report: dict[str, Any], path: Path) -> Path:
    """Per held-out family: answers kept where the full run settled, and reasoning saved, for the calibrated
    choice, the shipped default and the baselines."""
    rows = report["split"]["families"]
    names = ["calibrated", *rows[0]["compared"]]
    x = np.arange(len(rows))
    width = 0.8 / len(names)
    with figure(path, f"leave-one-family-out: {report['model']}", "", (12, 4.4), ncols=2) as axes:
        for ax, key, label in ((axes[0], "kept_settled", "answers kept where the full run settled (%)"),
                               (axes[1], "reasoning_saved", "reasoning tokens saved (%)")):
            for k, name in enumerate(names):
                values = [100 * (r["held_out"] if name == "calibrated" else r["compared"][name])[key]["value"]
                          for r in rows]
                ax.bar(x + k * width, values, width, label=name)
            ax.set_xticks(x + width * (len(names) - 1) / 2, [r["family"] for r in rows], rotation=30, ha="right")
            ax.set_ylabel(label)
        axes[0].axhline(100 * GOAL["kept_settled"], color="black", linestyle="--", linewidth=1)
        axes[1].axhline(100 * GOAL["reasoning_saved"], color="black", linestyle="--", linewidth=1)
    return path


def main(model: ChatGravity, tasks: Sequence[Task], concurrency: int, budget_backend: Callable[[int], Backend],
         epsilon: float, delta: float, out_dir: Path,
         on_method: Callable[[str, dict], None]) -> dict[str, Any]:
    """Run the split benchmark and write ``savings.json`` and ``savings.png`` under ``out_dir``."""
    report = run(model, tasks, concurrency, budget_backend, epsilon, delta, GRID, on_method)
    write_json(out_dir / "savings.json", report)
    plot(report, out_dir / "savings.png")
    return report
