"""``agent-gravity bench route``: route low-entropy work to cheaper compute, against random and prompt-length routing.

Every item of the task families is answered once per arm on one engine: in full (no gravity: the reference
answers), reasoning with gravity (the full tier), directly with no reasoning (the direct-answer probe, its
entropy score recorded), and on the cheap tier (its output's entropy quantiles recorded). Routing is then
bookkeeping over those answers, so every router is judged on the same outputs:

- **adaptive thinking**: for each family, Learn-then-Test certifies a direct-answer threshold on the other
  families (:mod:`agent_gravity.bench.heldout`), and the held-out family is answered directly where its score
  is under it, else with reasoning (probe tokens counted); random and prompt-length routing send the same number
  of that family's calls direct;
- **tiers**: deferral curves, quality (answers kept against the full tier, accuracy) against the share of calls
  sent up from the cheap tier, for entropy quantiles, random deferral (its expectation) and longest prompts first.

Two online arms then run what the routers decided, through ``ChatGravity(route=...)`` and
``ChatGravity(tiers=...)``, for the wall time and the cost (tokens weighted by each tier's measured seconds per
token) that bookkeeping cannot give.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig, RouteConfig, Tier
from agent_gravity._limits import MAX_NATS
from agent_gravity.bench import _stats
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench.heldout import folds, leave_one_family_out
from agent_gravity.bench.savings import (
    FULL,
    Answers,
    Budgets,
    ItemResult,
    _warm,
    run_method,
    run_references,
    summarize,
)
from agent_gravity.bench.tasks import Task, agrees

REASON = "reason"
DIRECT = "direct"
CHEAP = "cheap"
THRESHOLDS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
"""Direct-answer thresholds (nats), most conservative first: the order Learn-then-Test walks."""
SCORES = ("q90", "q50", "max", "mean", "answer_q90")
SHARES = tuple(i / 10 for i in range(11))
GOAL = {"reasoning_saved": 0.50, "kept_settled": 0.95}


def _direct_at(threshold: float) -> str:
    return f"direct<={threshold:g}"


def adaptive_results(direct: Sequence[ItemResult], reason: Sequence[ItemResult], threshold: float) -> list[ItemResult]:
    """What adaptive thinking at ``threshold`` answers per item: the direct answer where its score is at most the
    threshold, else the reasoned one with the probe's tokens added."""
    out = []
    for d, r in zip(direct, reason, strict=True):
        score = d.route["direct_score"] if d.route else None
        if score is not None and score <= threshold:
            out.append(d)
        else:
            out.append(dataclasses.replace(r, probe_tokens=r.probe_tokens + d.output_tokens))
    return out


def direct_share(direct: Sequence[ItemResult], threshold: float, idx: Sequence[int]) -> float:
    """Share of the items ``idx`` whose direct answer scores at most ``threshold``."""
    scores = [direct[i].route["direct_score"] for i in idx]
    return sum(s is not None and s <= threshold for s in scores) / max(1, len(idx))


def _baseline_kept(tasks: Sequence[Task], full: Sequence[ItemResult], direct: Sequence[ItemResult],
                   reason: Sequence[ItemResult], idx: Sequence[int], order: Sequence[int], k: int) -> float:
    """Answers kept on ``idx`` when the first ``k`` of ``order`` answer directly and the rest reason."""
    chosen = set(order[:k])
    kept = [agrees(tasks[i], full[i].answer, (direct if i in chosen else reason)[i].answer) for i in idx]
    return sum(kept) / max(1, len(kept))


def _random_kept(tasks: Sequence[Task], full: Sequence[ItemResult], direct: Sequence[ItemResult],
                 reason: Sequence[ItemResult], idx: Sequence[int], share: float) -> float:
    """The expected answers kept when a random ``share`` of ``idx`` answers directly."""
    kd = [agrees(tasks[i], full[i].answer, direct[i].answer) for i in idx]
    kr = [agrees(tasks[i], full[i].answer, reason[i].answer) for i in idx]
    return float(np.mean([share * d + (1 - share) * r for d, r in zip(kd, kr)])) if idx else math.nan


def threshold_answers(tasks: Sequence[Task], full: list[ItemResult], references: dict[str, ItemResult],
                      reason: list[ItemResult], direct: list[ItemResult]) -> Answers:
    """Every direct-answer threshold's answers (and always reasoning's), for Learn-then-Test over ``THRESHOLDS``."""
    runs = {REASON: reason, **{_direct_at(t): adaptive_results(direct, reason, t) for t in THRESHOLDS}}
    return Answers(tasks, full, references, runs)


def adaptive_report(tasks: Sequence[Task], full: list[ItemResult], references: dict[str, ItemResult],
                    reason: list[ItemResult], direct: list[ItemResult], epsilon: float,
                    delta: float) -> dict[str, Any]:
    """Leave-one-family-out over direct-answer thresholds, with random and prompt-length routing at each family's
    direct share."""
    answers = threshold_answers(tasks, full, references, reason, direct)
    split = leave_one_family_out(answers, [_direct_at(t) for t in THRESHOLDS], REASON, epsilon, delta, (REASON,))
    for row, fold in zip(split["families"], folds(tasks)):
        idx = fold.evaluation
        threshold = float(row["chosen"].split("<=")[1]) if row["chosen"] != REASON else -1.0
        share = direct_share(direct, threshold, idx)
        k = round(share * len(idx))
        by_length = sorted(idx, key=lambda i: full[i].prompt_tokens)
        row["direct_share"] = share
        row["kept_all"] = row["held_out"]["preservation"]["value"]
        row["random_kept"] = _random_kept(tasks, full, direct, reason, idx, share)
        row["length_kept"] = _baseline_kept(tasks, full, direct, reason, idx, by_length, k)
        row["goal"] = {"reasoning_saved": row["held_out"]["reasoning_saved"]["value"] >= GOAL["reasoning_saved"],
                       "kept_settled": row["held_out"]["kept_settled"]["value"] >= GOAL["kept_settled"]
                       or row["held_out"]["kept_settled"]["value"] != row["held_out"]["kept_settled"]["value"],
                       "beats_random": share == 0 or row["kept_all"] > row["random_kept"]}
    rows = split["families"]
    split["goal"] = {k: all(r["goal"][k] for r in rows) for k in ("reasoning_saved", "kept_settled", "beats_random")}
    split["goal"]["met"] = all(split["goal"].values())
    split["direct_alone"] = summarize(tasks, full, direct, None)
    split["direct_score_when_kept"] = _stats.mean_ci(
        [d.route["direct_score"] for t, f, d in zip(tasks, full, direct) if agrees(t, f.answer, d.answer)])
    split["direct_score_when_changed"] = _stats.mean_ci(
        [d.route["direct_score"] for t, f, d in zip(tasks, full, direct) if not agrees(t, f.answer, d.answer)])
    return split


def deferral_curves(tasks: Sequence[Task], cheap: Sequence[ItemResult], top: Sequence[ItemResult],
                    seed: int = 0) -> dict[str, Any]:
    """Quality against the share of calls sent up from the cheap tier, per router, at ``SHARES``.

    Quality is answers kept against the top tier's and accuracy on graded items. Entropy routers send the
    highest scores up first; ``length`` the longest prompts; ``random`` is the expectation over random choices.
    """
    n = len(tasks)
    kept = np.array([[agrees(t, f.answer, c.answer), True] for t, f, c in zip(tasks, top, cheap)], dtype=float)
    graded = [i for i, t in enumerate(tasks) if t.answer is not None]
    correct = np.array([[c.correct, f.correct] for c, f in zip(cheap, top)], dtype=float)

    def curve(order: Sequence[int]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"kept": [], "accuracy": []}
        for share in SHARES:
            up = np.zeros(n, dtype=int)
            up[list(order[:round(share * n)])] = 1
            out["kept"].append(float(kept[np.arange(n), up].mean()))
            out["accuracy"].append(float(correct[graded, up[graded]].mean()) if graded else math.nan)
        return out

    def ordered(key: Callable[[int], float]) -> list[int]:
        return sorted(range(n), key=lambda i: (-key(i), i))

    routers = {f"entropy {s}": curve(ordered(lambda i, s=s: _score(cheap[i], s))) for s in SCORES}
    routers["length"] = curve(ordered(lambda i: cheap[i].prompt_tokens))
    sent = [round(s * n) / n for s in SHARES]  # the share each router really sends up, ``n`` being whole calls
    routers["random"] = {m: [float((1 - s) * col[:, 0].mean() + s * col[:, 1].mean()) if len(col) else math.nan
                             for s in sent] for m, col in (("kept", kept), ("accuracy", correct[graded]))}
    area = {name: {m: float(np.trapezoid(c[m], SHARES)) for m in c} for name, c in routers.items()}
    best = max((r for r in routers if r.startswith("entropy")), key=lambda r: area[r]["kept"])
    dominates = {other: all(routers[best]["kept"][j] >= routers[other]["kept"][j] - 1e-12 for j in range(len(SHARES)))
                 for other in ("random", "length")}
    return {"shares": list(SHARES), "routers": routers, "area": area, "best_entropy_router": best,
            "dominates": dominates, "goal": {"dominates_random_and_length": all(dominates.values())}}


def _score(item: ItemResult, name: str) -> float:
    value = item.entropy_scores.get(name)
    return math.inf if value is None else value


def _cost(results: Sequence[ItemResult], seconds_per_token: dict[str, float], tier_of: Callable[[ItemResult],
          list[tuple[str, int]]]) -> dict[str, float]:
    """Tokens weighted by each tier's measured seconds per token, per item."""
    return _stats.mean_ci([sum(seconds_per_token[t] * n for t, n in tier_of(r)) for r in results])


def _tier_tokens(result: ItemResult) -> list[tuple[str, int]]:
    """The tokens a cascade call spent on each tier: every escalated tier's output, then the answering tier's."""
    route = result.route or {}
    spent = [(t["tier"], t["output_tokens"]) for t in route.get("tried", [])]
    escalated = sum(n for _, n in spent)  # already counted in ``spent`` (see _online)
    return [*spent, (route.get("tier", "full"), result.spent - escalated)]


def run(model: ChatGravity, tasks: Sequence[Task], concurrency: int, cheap_budget: int, epsilon: float,
        delta: float, on_arm: Callable[[str], None] = lambda name: None, budgets: Budgets = Budgets()
        ) -> dict[str, Any]:
    """Answer every item in each arm, route by bookkeeping, then run the chosen routes online; every arm runs at
    ``budgets`` but the cheap tier, which reasons for ``cheap_budget`` tokens."""
    _warm(model, tasks, concurrency)
    if cheap_budget < 2:
        raise ValueError(f"the cheap tier's reasoning budget must be at least 2 tokens, got {cheap_budget}")
    top = budgets.apply(GravityConfig())
    cheap_config = Budgets(cheap_budget, budgets.answer).apply(
        GravityConfig(min_tokens=min(top.min_tokens, cheap_budget // 2)))
    arms = {FULL: (budgets.full(), {}), REASON: (top, {}),
            DIRECT: (top, {"route": RouteConfig(think="adaptive", direct_below=MAX_NATS)}),
            CHEAP: (cheap_config, {})}
    results, walls = {}, {}
    for name, (config, options) in arms.items():
        results[name], walls[name] = run_method(model, tasks, config, concurrency, **options)
        on_arm(name)
    full, reason, direct, cheap = (results[k] for k in (FULL, REASON, DIRECT, CHEAP))
    per_token = {tier: walls[arm] / max(1, sum(r.spent for r in results[arm]))
                 for tier, arm in (("cheap", CHEAP), ("full", REASON))}
    references = run_references(model, tasks, full, concurrency, budgets)
    adaptive = adaptive_report(tasks, full, references, reason, direct, epsilon, delta)
    curves = deferral_curves(tasks, cheap, reason)
    online = _online(model, tasks, concurrency, adaptive, curves, cheap, (cheap_config, top), on_arm)
    answered = {**results, **{k: v[0] for k, v in online["results"].items()}}
    methods = {name: summarize(tasks, full, rs, walls.get(name), references) for name, rs in answered.items()}
    for name, rs in online["results"].items():
        methods[name]["wall_seconds"] = rs[1]
    cost = {REASON: _cost(reason, per_token, lambda r: [("full", r.spent)]),
            CHEAP: _cost(cheap, per_token, lambda r: [("cheap", r.spent)]),
            "cascade": _cost(online["results"]["cascade"][0], per_token, _tier_tokens)}
    cascade = online["results"]["cascade"][0]
    return {"model": model.get_backend().model_name, "items": len(tasks), "families": sorted({t.kind for t in tasks}),
            "concurrency": concurrency, "cheap_tier": {"max_reasoning_tokens": cheap_budget},
            "budgets": dataclasses.asdict(budgets),
            "seconds_per_token": per_token, "epsilon": epsilon, "delta": delta,
            "adaptive": adaptive, "deferral": curves, "methods": methods, "cost": cost,
            "cascade": {"escalate_above": online["escalate_above"], "quantile": 0.9,
                        "kept_on_cheap": sum((r.route or {}).get("tier") == "cheap" for r in cascade) / len(cascade),
                        "kept_vs_full_tier": sum(agrees(t, f.answer, c.answer)
                                                 for t, f, c in zip(tasks, reason, cascade)) / len(cascade),
                        "carried_tokens": _stats.mean_ci([(r.route or {}).get("carried_tokens", 0) for r in cascade
                                                          if (r.route or {}).get("tried")] or [0])},
            "per_item": {name: [dataclasses.asdict(r) for r in rs] for name, rs in answered.items()}}


def _online(model: ChatGravity, tasks: Sequence[Task], concurrency: int, adaptive: dict[str, Any],
            curves: dict[str, Any], cheap: Sequence[ItemResult], tiers: tuple[GravityConfig, GravityConfig],
            on_arm: Callable[[str], None]) -> dict[str, Any]:
    """Run adaptive thinking with each family's held-out threshold, and the cascade at the cheap tier's median
    q90 score (about half the calls sent up), through ChatGravity; ``tiers``: the cheap and the top settings."""
    cheap_config, top = tiers
    by_family: dict[str, list[ItemResult]] = {}
    order = {t.id: i for i, t in enumerate(tasks)}
    wall = 0.0
    for row in adaptive["families"]:
        family = [t for t in tasks if t.kind == row["family"]]
        threshold = float(row["chosen"].split("<=")[1]) if row["chosen"] != REASON else None
        route = RouteConfig(think="adaptive", direct_below=threshold) if threshold is not None else None
        by_family[row["family"]], seconds = run_method(model, family, top, concurrency, route=route)
        wall += seconds
    adaptive_online = sorted((r for rs in by_family.values() for r in rs), key=lambda r: order[r.id])
    on_arm("adaptive")
    scores = [s for s in (c.entropy_scores.get("q90") for c in cheap) if s is not None]
    above = float(np.median(scores)) if scores else 1.0
    tiered = ChatGravity(backend=model.get_backend(), tiers=[Tier(name="cheap", gravity=cheap_config),
                                                                Tier(name="full", gravity=top)],
                         route=RouteConfig(escalate_above=above, escalate_quantile=0.9))
    cascade, cascade_wall = run_method(tiered, tasks, None, concurrency)
    # an escalated tier's output was spent too: count it with the probes
    cascade = [dataclasses.replace(r, probe_tokens=r.probe_tokens + sum(t["output_tokens"] for t in
                                                                        (r.route or {}).get("tried", [])))
               for r in cascade]
    on_arm("cascade")
    return {"results": {"adaptive": (adaptive_online, wall), "cascade": (cascade, cascade_wall)},
            "escalate_above": above}


def table(report: dict[str, Any]) -> str:
    """Adaptive thinking per held-out family, the arms side by side, and the deferral curves' areas."""
    lines = [f"{'held-out family':<16} {'threshold':>10} {'direct %':>9} {'saved %':>9} {'kept settled %':>15} "
             f"{'kept %':>7} {'random %':>9} {'length %':>9}"]
    for r in report["adaptive"]["families"]:
        h = r["held_out"]
        lines.append(f"{r['family']:<16} {r['chosen']:>10} {100 * r['direct_share']:>9.1f} "
                     f"{100 * h['reasoning_saved']['value']:>9.1f} {100 * h['kept_settled']['value']:>15.1f} "
                     f"{100 * r['kept_all']:>7.1f} {100 * r['random_kept']:>9.1f} {100 * r['length_kept']:>9.1f}")
    g = report["adaptive"]["goal"]
    lines.append("adaptive goal: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in g.items()))
    lines.append("")
    lines.append(f"{'arm':<10} {'spent tok':>20} {'accuracy %':>20} {'kept vs full %':>20} {'wall s':>8}")
    for name, m in report["methods"].items():
        lines.append(f"{name:<10} {interval(m['spent_tokens']):>20} {interval(m['accuracy'], 100):>20} "
                     f"{interval(m['preservation'], 100):>20} {m['wall_seconds'] or math.nan:>8.1f}")
    c = report["cascade"]
    lines.append(f"cascade at q90 > {c['escalate_above']:.3f}: {100 * c['kept_on_cheap']:.1f}% kept on the cheap tier, "
                 f"{100 * c['kept_vs_full_tier']:.1f}% answers as the full tier's, escalated calls continue "
                 f"{c['carried_tokens']['value']:.1f} reasoning tokens of the cheap tier's")
    d = report["deferral"]
    lines.append("deferral areas (answers kept vs full tier): " + ", ".join(
        f"{name} {a['kept']:.3f}" for name, a in d["area"].items()))
    lines.append(f"{d['best_entropy_router']} dominates: " + ", ".join(
        f"{k}: {'yes' if v else 'NO'}" for k, v in d["dominates"].items()))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Deferral curves: answers kept and accuracy against the share sent up from the cheap tier."""
    d = report["deferral"]
    with figure(path, f"route: {report['model']}, {report['items']} items", "", (11, 4.2), ncols=2) as axes:
        for ax, metric, label in ((axes[0], "kept", "answers as the full tier's (%)"),
                                  (axes[1], "accuracy", "accuracy (%)")):
            for name, c in d["routers"].items():
                ax.plot([100 * s for s in d["shares"]], [100 * v for v in c[metric]],
                        "--" if name in ("random", "length") else "-", marker="o", ms=3, label=name)
            ax.set_xlabel("calls sent up from the cheap tier (%)")
            ax.set_ylabel(label)
    return path


def main(model: ChatGravity, tasks: Sequence[Task], concurrency: int, cheap_budget: int, epsilon: float,
         delta: float, out_dir: Path, on_arm: Callable[[str], None], budgets: Budgets = Budgets()) -> dict[str, Any]:
    """Run the benchmark; write ``route.json`` and ``route.png`` under ``out_dir``."""
    report = run(model, tasks, concurrency, cheap_budget, epsilon, delta, on_arm, budgets)
    write_json(out_dir / "route.json", report)
    plot(report, out_dir / "route.png")
    return report
