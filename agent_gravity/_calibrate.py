"""``agent-gravity calibrate``: pick the most saving thresholds that still keep the answers.

A warm-up task set (another seed than the benchmark's, so the benchmark is never tuned on) is
answered once in full and once per candidate: the default policy with every threshold scaled by a
factor. The candidate that saves the most reasoning tokens while keeping at least ``target`` of the
full run's answers becomes the model's profile, which ChatGravity then loads by itself.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig
from agent_gravity._profile import GravityProfile
from agent_gravity.bench.savings import run_method, summarize
from agent_gravity.bench.tasks import Task

FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
_SCALED = ("threshold", "varentropy_threshold", "ceiling")


def scaled(spec: dict[str, Any], factor: float) -> dict[str, Any]:
    """A policy spec with every threshold-like parameter (children included) multiplied by ``factor``."""
    out = {k: v * factor if k in _SCALED else v for k, v in spec.items() if k != "policies"}
    if "policies" in spec:
        out["policies"] = [scaled(child, factor) for child in spec["policies"]]
    if "release" in out and out["release"] is not None:
        out["release"] = out["release"] * factor
    return out


def candidates(base: GravityConfig, factors: Sequence[float] = FACTORS) -> dict[str, GravityConfig]:
    """The base configuration with its policy thresholds scaled by each factor; ValueError on a bad factor."""
    bad = [f for f in factors if not f > 0]
    if bad or not factors:
        raise ValueError(f"threshold factors must be positive numbers, got {list(factors)}")
    policy = base.policy or {"name": "window_mean"}
    dumped = base.model_dump()
    return {f"x{f:g}": GravityConfig.model_validate({**dumped, "policy": scaled(policy, f)}) for f in factors}


def choose(measured: dict[str, dict[str, Any]], target: float) -> tuple[str, bool]:
    """The candidate saving the most reasoning tokens at preservation >= target; else the best preserver."""
    def value(name: str, key: str) -> float:
        return measured[name][key]["value"]

    ok = [n for n in measured if value(n, "preservation") >= target]
    if ok:
        return max(ok, key=lambda n: (value(n, "reasoning_saved"), value(n, "preservation"))), True
    return max(measured, key=lambda n: (value(n, "preservation"), -value(n, "reasoning_tokens"))), False


def calibrate(model: ChatGravity, tasks: Sequence[Task], target: float, concurrency: int,
              factors: Sequence[float] = FACTORS,
              on_candidate: Callable[[str, dict], None] = lambda n, m: None) -> GravityProfile:
    """Measure every candidate against the full run and return the profile of the chosen one."""
    if not 0 < target <= 1:
        raise ValueError(f"target must be a preservation rate in (0, 1], got {target}")
    configs = candidates(GravityConfig(), factors)  # validated before the long full run starts
    full, _ = run_method(model, tasks, GravityConfig(enabled=False), concurrency)
    measured = {}
    for name, config in configs.items():
        results, wall = run_method(model, tasks, config, concurrency)
        measured[name] = summarize(tasks, full, results, wall)
        on_candidate(name, measured[name])
    name, met = choose(measured, target)
    m = measured[name]
    return GravityProfile(model=model.get_backend().model_name, gravity=configs[name], measured={
        "candidate": name, "target": target, "target_met": met, "items": len(tasks),
        "preservation": m["preservation"], "reasoning_saved": m["reasoning_saved"],
        "candidates": {n: {"preservation": c["preservation"]["value"], "reasoning_saved": c["reasoning_saved"]["value"]}
                       for n, c in measured.items()},
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    })
