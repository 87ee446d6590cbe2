"""``bench savings --split leave-one-family-out``: calibrate on every family but one, report on the one left out.

Every method and calibration candidate answers every item once; the split is bookkeeping over those
answers. For each family, risk-controlled calibration (:mod:`agent_gravity._risk`) sees only the other
families' items and picks a candidate; the held-out family's items then measure what that choice does on
questions worded unlike anything it was calibrated on. The report gives every family, the worst one and
the mean, the shipped default and the baselines on the same families, and a paraphrase check.
"""

from __future__ import annotations

import dataclasses
import json
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
from agent_gravity.bench.families import load_families
from agent_gravity.bench.savings import (
    DEFAULT,
    DYNASOR,
    FULL,
    REFERENCE_SCALE,
    VLLM_BUDGET,
    Answers,
    Budgets,
    ItemResult,
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


def _at_least(figure: dict[str, Any], floor: float) -> bool:
    """A figure meets its floor; one that does not apply to a family (nan: no such items) does not count against
    it."""
    value = figure["value"]
    return value != value or value >= floor


def _meets(s: dict[str, Any]) -> dict[str, bool]:
    return {"kept_settled": _at_least(s["kept_settled"], GOAL["kept_settled"]),
            "no_capped_accuracy_loss": _at_least(s["capped_accuracy_change"], 0.0),
            "accuracy_loss_at_most_1pt": _at_least(s["accuracy_change"], GOAL["accuracy_change"]),
            "reasoning_saved": _at_least(s["reasoning_saved"], GOAL["reasoning_saved"])}


def leave_one_family_out(answers: Answers, candidates: Sequence[str], fallback: str, epsilon: float,
                         delta: float, compared: Sequence[str] = ()) -> dict[str, Any]:
    """Calibrate on all families but one, evaluate the choice on the one left out, for every family.

    ``fallback`` is the configuration kept when no candidate meets the bound; ``compared`` are methods reported
    on each held-out family beside the calibrated choice (the shipped default, the baselines). The held-out
    loss is a point estimate on one family: the guarantee is about the expected loss on questions like the
    calibration set's, so a family unlike the others may exceed epsilon, which the report then names.
    """
    rows = []
    for fold in folds(answers.tasks):
        selection = answers.select(candidates, fold.calibration, epsilon, delta)
        chosen = selection.chosen or fallback
        held = answers.summary(chosen, fold.evaluation)
        rows.append({
            "family": fold.family, "items": len(fold.evaluation), "calibration_items": len(fold.calibration),
            "calibration_families": sorted({answers.tasks[i].kind for i in fold.calibration}),
            "chosen": chosen, "bound_met": selection.met,
            "bound": selection.test(selection.chosen).bound if selection.chosen else None,
            "tests": [dataclasses.asdict(t) for t in selection.tests],
            "held_out": held, "loss_within_epsilon": held["answer_loss"]["value"] <= epsilon, "goal": _meets(held),
            "compared": {m: answers.summary(m, fold.evaluation) for m in compared},
        })
    return {"epsilon": epsilon, "delta": delta, "candidates": list(candidates), "fallback": fallback,
            "families": rows, "worst": _worst(rows), "mean": _mean(rows), "goal": _goal(rows)}


def _extreme(rows: list[dict[str, Any]], key: str, pick: Callable) -> dict[str, Any] | None:
    """The family where ``key`` is lowest (``pick=min``) or highest (``max``), skipping families it does not
    apply to."""
    known = [r for r in rows if r["held_out"][key]["value"] == r["held_out"][key]["value"]]
    row = pick(known, key=lambda r: r["held_out"][key]["value"], default=None)
    return None if row is None else {"family": row["family"], "value": row["held_out"][key]["value"]}


def _worst(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {**{k: _extreme(rows, k, min) for k in ("kept_settled", "reasoning_saved", "accuracy_change")},
            "answer_loss": _extreme(rows, "answer_loss", max)}


def _mean(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("kept_settled", "reasoning_saved", "accuracy_change", "answer_loss")
    return {k: float(np.nanmean([r["held_out"][k]["value"] for r in rows])) for k in keys}


def _goal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    per_family = {r["family"]: all(r["goal"].values()) for r in rows}
    mean_saved = _mean(rows)["reasoning_saved"]
    checks = {"every_family": all(per_family.values()),
              "mean_saving": mean_saved >= GOAL["mean_reasoning_saved"],
              "loss_within_epsilon_on_every_family": all(r["loss_within_epsilon"] for r in rows)}
    return {**checks, "met": all(checks.values()), "families_missing": [f for f, ok in per_family.items() if not ok]}


def paraphrase_check(answers: Answers, method: str, seed: int = 0, resamples: int = 2000) -> dict[str, Any]:
    """Does the wording decide whether ``method`` keeps the answer? Twin pairs against random pairs.

    Only questions where ``method`` ended the reasoning early in at least one wording count (elsewhere nothing
    could be lost). A pair is discordant when one wording keeps its answer and the other loses it. If the
    outcome were a property of the question, twins would rarely be discordant; if the wording decided it, twins
    would be as discordant as two random questions of the same family. ``p_value`` is the permutation
    probability of twins being at least this discordant when questions are paired at random within their family
    (small: the wording matters as much as the question), with ``discordant_pairs`` for the raw count.
    """
    pairs: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, t in enumerate(answers.tasks):
        if t.pair is not None:
            pairs[(t.kind, t.pair)].append(i)
    runs = answers.runs[method]
    twins = [(key, idx) for key, idx in pairs.items()
             if len(idx) == 2 and any(runs[i].terminated_early for i in idx)]
    if not twins:
        return {"pairs": 0}
    kept = {i: 1 - loss for _, idx in twins for i, loss in zip(idx, answers.losses(method, idx), strict=True)}
    observed = sum(kept[a] != kept[b] for _, (a, b) in twins)
    by_family: dict[str, list[int]] = defaultdict(list)
    for (family, _), idx in twins:
        by_family[family].extend(kept[i] for i in idx)
    rng = np.random.default_rng(seed)
    shuffled = []
    for _ in range(resamples):
        values = [rng.permutation(v) for v in by_family.values()]
        shuffled.append(sum(int(np.sum(v[0::2] != v[1::2])) for v in values))
    return {"pairs": len(twins), "discordant_pairs": observed, "discordant": observed / len(twins),
            "chance": float(np.mean(shuffled)) / len(twins),
            "p_value": (1 + sum(s >= observed for s in shuffled)) / (1 + resamples),
            "lost_items": sum(1 - v for v in kept.values())}


def _percent(figure: dict[str, Any]) -> str:
    return "-" if figure["value"] != figure["value"] else f"{100 * figure['value']:.1f}%"


def table(report: dict[str, Any]) -> str:
    """One row per held-out family (the calibrated choice), then the worst, the mean and the verdict."""
    split = report["split"]
    head = (f"{'held out':<15} {'chosen':<10} {'kept (settled) %':>22} {'capped acc Δ pt':>22} "
            f"{'acc Δ pt':>20} {'reasoning saved %':>22} {'loss %':>7} {'bound %':>8}")
    ref = report["reference"]
    lines = [f"leave-one-family-out, epsilon {split['epsilon']}, delta {split['delta']}; the full run settled "
             f"{ref['settled_items']} items and was capped on {ref['capped_items']} ({ref['answer_capped_items']} "
             f"of them answers that ran into the output cap after the reasoning closed); their "
             f"{REFERENCE_SCALE}x-budget reference settled {_percent(ref['reference_settled'])}, the full answer "
             f"agreeing on {_percent(ref['full_agrees_with_reference'])}", head, "-" * len(head)]
    for r in split["families"]:
        h = r["held_out"]
        bound = f"{100 * r['bound']:.1f}" if r["bound"] is not None else "none"
        lines.append(f"{r['family']:<15} {r['chosen']:<10} {interval(h['kept_settled'], 100):>22} "
                     f"{interval(h['capped_accuracy_change'], 100):>22} {interval(h['accuracy_change'], 100):>20} "
                     f"{interval(h['reasoning_saved'], 100):>22} {100 * h['answer_loss']['value']:>7.1f} {bound:>8}")
    lines.append("reasoning saved where the full run closed its reasoning / in rambles it ran into the reasoning "
                 "budget (those rambles' share of its reasoning):")
    lines.extend(f"  {r['family']:<15} {_percent(r['held_out']['reasoning_saved_settled'])} / "
                 f"{_percent(r['held_out']['reasoning_saved_capped'])} "
                 f"({100 * r['held_out']['capped_reasoning_share']:.0f}%)" for r in split["families"])
    w, m = split["worst"], split["mean"]
    worst = ", ".join(f"{label} {100 * w[k]['value']:.1f}% ({w[k]['family']})" for k, label in
                      (("kept_settled", "kept"), ("reasoning_saved", "saved"), ("answer_loss", "loss")) if w[k])
    lines.append(f"worst family: {worst}")
    lines.append(f"mean: kept {100 * m['kept_settled']:.1f}%, saved {100 * m['reasoning_saved']:.1f}%, "
                 f"accuracy {100 * m['accuracy_change']:+.1f} pt, loss {100 * m['answer_loss']:.1f}%")
    for name in split["families"][0]["compared"]:
        kept = [r["compared"][name]["kept_settled"]["value"] for r in split["families"]]
        saved = [r["compared"][name]["reasoning_saved"]["value"] for r in split["families"]]
        lines.append(f"{name:<12} worst kept {100 * np.nanmin(kept):.1f}%, mean kept {100 * np.nanmean(kept):.1f}%, "
                     f"worst saved {100 * np.nanmin(saved):.1f}%, mean saved {100 * np.nanmean(saved):.1f}%")
    d = report["methods"].get(DEFAULT)
    if d is not None and "lost_by_reason" in d:
        lines.append(f"why {DEFAULT} lost answers: by exit {d['lost_by_reason']} ({d['lost_in_answer']} with all of the "
                     "full run's reasoning: the answer itself was cut), at "
                     f"{interval(d['lost_exit_position'], 100, 0)}% of the full run's reasoning, least probe "
                     f"confidence {interval(d['lost_confidence'], 1, 2)}")
    p = report.get("paraphrase", {})
    if p and not p.get("pairs"):
        lines.append(f"paraphrases ({p['method']}): no question had an early exit in either wording")
    elif p:
        lines.append(f"paraphrases ({p['method']}): of {p['pairs']} questions with an early exit, "
                     f"{p['discordant_pairs']} keep the answer in one wording and lose it in the other "
                     f"({100 * p['discordant']:.1f}%; random pairs of the same family: {100 * p['chance']:.1f}%, "
                     f"p = {p['p_value']:.3f})")
    g = split["goal"]
    lines.append(f"goal: {'met' if g['met'] else 'not met'} (every family: {g['every_family']}, "
                 f"mean saving >= {100 * GOAL['mean_reasoning_saved']:.0f}%: {g['mean_saving']}, loss within epsilon "
                 f"on every family: {g['loss_within_epsilon_on_every_family']}; missing: {g['families_missing']})")
    return "\n".join(lines)


@dataclass
class Experiment:
    """Every answer of one split run, and what is needed to analyse it again without the model."""

    model: str
    answers: Answers
    walls: dict[str, float | None]
    budget: int
    concurrency: int
    configs: dict[str, dict[str, Any]]


def answer_all(model: ChatGravity, tasks: Sequence[Task], concurrency: int, budget_backend: Callable[[int], Backend],
               grid: Sequence[Candidate] = GRID,
               on_method: Callable[[str, dict], None] = lambda n, s: None,
               baseline: Experiment | None = None, budgets: Budgets = Budgets()) -> Experiment:
    """Answer every item in full, the capped items again with 4x the budget (their references), and with every
    grid candidate and the baselines: Dynasor-style probing, and vLLM's budget at the default's mean reasoning
    length over all items (the same mean tokens, not a per-family tuning).

    ``baseline`` (an earlier split run of the same items on the same model) supplies the full and reference
    answers, which gravity does not touch, so only the methods gravity steers run again.
    """
    configs = budgets.apply_all({**candidates(GravityConfig(), grid),
                                 DYNASOR: method_configs(GravityConfig())[DYNASOR]})
    if baseline is not None:
        check_baseline(baseline, tasks, model.get_backend().model_name, budgets)
    _warm(model, tasks, concurrency)
    if baseline is None:
        full, wall = run_method(model, tasks, budgets.full(), concurrency)
        references = run_references(model, tasks, full, concurrency, budgets)
    else:
        full, wall, references = baseline.answers.full, baseline.walls.get(FULL), baseline.answers.references
    runs, walls = {FULL: full}, {FULL: wall}
    for name, config in configs.items():
        runs[name], walls[name] = run_method(model, tasks, config, concurrency)
        on_method(name, summarize(tasks, full, runs[name], walls[name], references))
    budget = max(1, round(sum(r.reasoning_tokens for r in runs[DEFAULT]) / len(tasks)))
    capped_model = ChatGravity(backend=budget_backend(budget), gravity=model.gravity)
    runs[VLLM_BUDGET], walls[VLLM_BUDGET] = run_method(capped_model, tasks, budgets.full(), concurrency)
    on_method(VLLM_BUDGET, summarize(tasks, full, runs[VLLM_BUDGET], walls[VLLM_BUDGET], references))
    return Experiment(model.get_backend().model_name, Answers(tasks, full, references, runs), walls, budget,
                      concurrency, {n: c.model_dump(mode="json") for n, c in configs.items()})


def check_baseline(baseline: Experiment, tasks: Sequence[Task], model: str | None = None,
                   budgets: Budgets | None = None) -> None:
    """ValueError unless ``baseline`` answered exactly ``tasks`` (same ids and questions), with ``model`` and
    ``budgets`` if given."""
    if model is not None and baseline.model != model:
        raise ValueError(f"the baseline run used model {baseline.model!r}, this one {model!r}: rerun without --baseline")
    if [(t.id, t.question) for t in baseline.answers.tasks] != [(t.id, t.question) for t in tasks]:
        raise ValueError("the baseline run answered other items (pass the same --per-family and --families as it "
                         "did, or rerun without --baseline)")
    if budgets is not None and DEFAULT not in baseline.configs:
        raise ValueError("the baseline run records no configuration of 'default', so its budgets are unknown: rerun "
                         "without --baseline")
    if budgets is not None and (theirs := Budgets.of(baseline.configs[DEFAULT])) != budgets:
        raise ValueError(f"the baseline run had reasoning/answer budgets {theirs.reasoning}/{theirs.answer}, this "
                         f"one {budgets.reasoning}/{budgets.answer}: pass the same --max-reasoning-tokens and "
                         "--max-answer-tokens, or rerun without --baseline")


def analyse(experiment: Experiment, grid: Sequence[str], epsilon: float, delta: float) -> dict[str, Any]:
    """The split report of an experiment: leave-one-family-out over ``grid``, every family, the paraphrase check."""
    check_levels(epsilon, delta)
    a = experiment.answers
    tasks, full, references = a.tasks, a.full, a.references
    return {
        "model": experiment.model, "items": len(tasks), "concurrency": experiment.concurrency,
        "families": sorted({t.kind for t in tasks}), "vllm_thinking_token_budget": experiment.budget,
        "reference": reference_figures(tasks, full, references),
        "methods": {n: summarize(tasks, full, r, experiment.walls.get(n), references) for n, r in a.runs.items()},
        "by_family": {f.family: {n: a.summary(n, f.evaluation) for n in a.runs} for f in folds(tasks)},
        "configs": experiment.configs,
        "split": leave_one_family_out(a, grid, DEFAULT, epsilon, delta, [DEFAULT, DYNASOR, VLLM_BUDGET]),
        "paraphrase": {"method": DEFAULT, **paraphrase_check(a, DEFAULT)},
        "tasks": [dataclasses.asdict(t) for t in tasks],
        "per_item": {n: [dataclasses.asdict(r) for r in rs] for n, rs in a.runs.items()},
        "references": {k: dataclasses.asdict(r) for k, r in references.items()},
    }


def _item(data: dict[str, Any]) -> ItemResult:
    tuples = ("probe_steps", "probe_answers", "probe_confidence")
    return ItemResult(**{k: tuple(v) if k in tuples else v for k, v in data.items()})


def load_experiment(path: Path) -> Experiment:
    """The answers a split run wrote to ``savings.json``, to analyse again (other epsilon or delta, say).

    ValueError names the file when it is not a split run's report, or when it predates finish reasons (an answer
    cut by the output cap could not be told from a settled one). Reports from before tasks were stored with them
    are matched by item id against the shipped family set.
    """
    try:
        report = json.loads(Path(path).read_text())
        per_item, refs = report["per_item"], report["references"]
        stale = any("finish_reason" not in r for r in per_item[FULL])
        by_id = {t.id: t for t in load_families()} if "tasks" not in report else None
        tasks = ([Task(**t) for t in report["tasks"]] if by_id is None else [by_id[r["id"]] for r in per_item[FULL]])
        runs = {n: [_item(r) for r in rows] for n, rows in per_item.items()}
        walls = {n: m.get("wall_seconds") for n, m in report["methods"].items()}
        experiment = Experiment(report["model"], Answers(tasks, runs[FULL], {k: _item(v) for k, v in refs.items()},
                                                         runs),
                                walls, report["vllm_thinking_token_budget"], report["concurrency"], report["configs"])
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not the savings.json of a split run (bench savings --split ...): {exc!r}") from exc
    if stale:
        raise ValueError(f"{path} predates finish reasons, so the items whose full answer ran into the output cap "
                         "cannot be told apart: run the split again without --baseline or --answers")
    return experiment


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


def main(experiment: Experiment, grid: Sequence[str], epsilon: float, delta: float, out_dir: Path) -> dict[str, Any]:
    """Analyse ``experiment`` and write ``savings.json`` and ``savings.png`` under ``out_dir``."""
    report = analyse(experiment, grid, epsilon, delta)
    write_json(out_dir / "savings.json", report)
    plot(report, out_dir / "savings.png")
    return report
