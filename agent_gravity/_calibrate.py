"""``agent-gravity calibrate``: the most saving exit settings whose answer loss is certified, per model.

A calibration task set (families of questions in several wordings, on another seed than the
benchmark's) is answered once in full, the items the full run capped once more with a larger budget
(their reference), and once per candidate of an ordered grid, from the most conservative to the most
aggressive. Learn-then-Test (:mod:`agent_gravity._risk`) keeps the candidates whose expected answer
loss is at most ``epsilon`` with probability at least ``1 - delta`` on questions exchangeable with the
calibration set (each question counted once, lost when any of its wordings lost its answer), and the one
saving the most reasoning becomes the model's profile. When none is
certified the profile says so and keeps the shipped defaults.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import GravityConfig, ProbeConfig, RouteConfig
from agent_gravity._limits import MAX_NATS
from agent_gravity._profile import Calibration, GravityProfile, RouteCalibration
from agent_gravity._risk import Selection, check_levels, items_needed
from agent_gravity.bench.savings import Answers, Budgets, ItemResult, run_method, run_references
from agent_gravity.bench.tasks import Task

_SCALED = ("threshold", "varentropy_threshold", "ceiling")
DEFAULT_CANDIDATE = "default"


def scaled(spec: dict[str, Any], factor: float) -> dict[str, Any]:
    """A policy spec with every threshold-like parameter (children included) multiplied by ``factor``."""
    out = {k: v * factor if k in _SCALED else v for k, v in spec.items() if k != "policies"}
    if "policies" in spec:
        out["policies"] = [scaled(child, factor) for child in spec["policies"]]
    if "release" in out and out["release"] is not None:
        out["release"] = out["release"] * factor
    return out


@dataclass(frozen=True)
class Candidate:
    """One point of the calibration grid: the base policy's thresholds scaled, and probe settings changed."""

    name: str
    factor: float = 1.0
    probe: dict[str, Any] = field(default_factory=dict)

    def config(self, base: GravityConfig) -> GravityConfig:
        """``base`` with this candidate's changes; ValueError for a non-positive factor."""
        if not self.factor > 0:
            raise ValueError(f"candidate {self.name}: threshold factors must be positive, got {self.factor}")
        policy = scaled(base.policy or {"name": "window_mean"}, self.factor)
        probe = {**(base.probe or ProbeConfig()).model_dump(), **self.probe}
        return GravityConfig.model_validate({**base.model_dump(), "policy": policy, "probe": probe})


GRID: tuple[Candidate, ...] = (
    Candidate("strict", 0.5, {"agree": 3, "min_confidence": 0.9, "lenient_after": None}),
    Candidate("careful", 0.75, {"min_confidence": 0.9, "lenient_after": 96, "max_probes": 24}),
    Candidate(DEFAULT_CANDIDATE),
    Candidate("loose", 1.5, {"min_confidence": 0.6, "lenient_after": 48}),
    Candidate("eager", 2.0, {"min_confidence": None, "interval": 16}),
)
"""Most conservative first: Learn-then-Test walks this order and stops at the first uncertified candidate."""


def candidates(base: GravityConfig, grid: Sequence[Candidate] = GRID) -> dict[str, GravityConfig]:
    """The grid's configurations by name, in order (validated before any long run starts)."""
    if not grid:
        raise ValueError("the calibration grid is empty")
    return {c.name: c.config(base) for c in grid}


def calibration_record(selection: Selection, tasks: Sequence[Task]) -> Calibration:
    """What a profile records of a calibration: the guarantee asked for, the data, the outcome.

    The guarantee is Learn-then-Test's: the chosen candidate's expected loss is at most epsilon. ``bound`` is
    its Clopper-Pearson bound before the choice among passing candidates, reported as evidence, not certified.
    """
    chosen = selection.test(selection.chosen) if selection.chosen else None
    return Calibration(
        epsilon=selection.epsilon, delta=selection.delta, bound_met=selection.met, candidate=selection.chosen,
        bound=chosen.bound if chosen else None, loss=chosen.losses / chosen.n if chosen else None,
        reasoning_saved=chosen.saving if chosen else None, items=len(tasks),
        families=sorted({t.kind for t in tasks}),
        guarantee=(f"with probability >= {1 - selection.delta:g}, the expected share of lost answers is <= "
                   f"{selection.epsilon:g} on questions exchangeable with the calibration set")
        if selection.met else "no candidate met the bound: the shipped defaults are kept",
        when=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))


def _enough_questions(tasks: Sequence[Task], epsilon: float, delta: float) -> None:
    """ValueError when the calibration set is too small to certify anything at these levels."""
    check_levels(epsilon, delta)
    questions = len({t.pair or t.id for t in tasks})  # two wordings of one question are one draw
    if questions < items_needed(epsilon, delta):
        raise ValueError(f"{questions} calibration questions cannot certify epsilon={epsilon} at delta={delta}: "
                         f"even with no loss at all it takes {items_needed(epsilon, delta)}; add items or "
                         "loosen epsilon or delta")


def calibrate(model: ChatGravity, tasks: Sequence[Task], epsilon: float = 0.05, delta: float = 0.1,
              concurrency: int = 8, grid: Sequence[Candidate] = GRID,
              on_candidate: Callable[[str, list[ItemResult]], None] = lambda n, r: None,
              budgets: Budgets = Budgets()) -> GravityProfile:
    """Measure every candidate against the full run, all at ``budgets``, and return the profile of the certified
    one (which keeps those budgets: they are what was certified)."""
    _enough_questions(tasks, epsilon, delta)
    configs = budgets.apply_all(candidates(GravityConfig(), grid))
    full, _ = run_method(model, tasks, budgets.full(), concurrency)
    references = run_references(model, tasks, full, concurrency, budgets)
    runs = {}
    for name, config in configs.items():
        runs[name], _ = run_method(model, tasks, config, concurrency)
        on_candidate(name, runs[name])
    answers = Answers(tasks, full, references, runs)
    selection = answers.select(list(configs), range(len(tasks)), epsilon, delta)
    gravity = configs[selection.chosen] if selection.chosen else GravityConfig()
    return GravityProfile(model=model.get_backend().model_name, gravity=gravity,
                          calibration=calibration_record(selection, tasks),
                          measured={"tests": [dataclasses.asdict(t) for t in selection.tests]})


def calibrate_route(model: ChatGravity, tasks: Sequence[Task], epsilon: float = 0.05, delta: float = 0.1,
                    concurrency: int = 8, budgets: Budgets = Budgets()) -> RouteCalibration:
    """Certify the most saving direct-answer threshold of adaptive thinking at a bounded answer loss.

    Each item is answered in full (the reference), with reasoning under the model's gravity, and directly (its
    entropy score recorded); thresholds are tested from the most conservative up (Learn-then-Test), an item's
    answer under a threshold being the direct one where its score is at most the threshold, else the reasoned one.
    """
    from agent_gravity.bench.route import THRESHOLDS, _direct_at, direct_share, threshold_answers

    _enough_questions(tasks, epsilon, delta)
    full, _ = run_method(model, tasks, budgets.full(), concurrency)
    references = run_references(model, tasks, full, concurrency, budgets)
    gravity = budgets.apply(model.gravity)
    reason, _ = run_method(model, tasks, gravity, concurrency)
    direct, _ = run_method(model, tasks, gravity, concurrency,
                           route=RouteConfig(think="adaptive", direct_below=MAX_NATS))
    answers = threshold_answers(tasks, full, references, reason, direct)
    selection = answers.select([_direct_at(t) for t in THRESHOLDS], range(len(tasks)), epsilon, delta)
    chosen = selection.test(selection.chosen) if selection.chosen else None
    below = THRESHOLDS[[_direct_at(t) for t in THRESHOLDS].index(selection.chosen)] if chosen else None
    return RouteCalibration(
        direct_below=below, epsilon=epsilon, delta=delta, bound=chosen.bound if chosen else None,
        loss=chosen.losses / chosen.n if chosen else None,
        direct_share=direct_share(direct, below, range(len(tasks))) if chosen else None,
        reasoning_saved=chosen.saving if chosen else None, items=len(tasks), families=sorted({t.kind for t in tasks}),
        guarantee=(f"with probability >= {1 - delta:g}, answering directly under {below:g} nats changes at most "
                   f"{epsilon:g} of answers in expectation on questions exchangeable with the calibration set")
        if chosen else "no threshold met the bound: adaptive thinking reasons on every call",
        tests=[dataclasses.asdict(t) for t in selection.tests],
        when=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
