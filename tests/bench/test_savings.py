"""The savings benchmark's arithmetic, verdict and outputs; the engine run is in test_savings_engine."""

from __future__ import annotations

import dataclasses
import math

import pytest

from agent_gravity._cli import _SAVINGS_METHODS
from agent_gravity._config import GravityConfig, ReasoningFormat
from agent_gravity.backends.base import GenerationRequest, SamplingSettings
from agent_gravity.bench import _stats, savings
from agent_gravity.bench.savings import Budgets, ItemResult, ThinkingBudgetBackend, goal, summarize
from agent_gravity.bench.tasks import Task


def test_wilson_interval_matches_the_textbook_and_stays_inside_0_1():
    ci = _stats.wilson(8, 10)
    assert ci["value"] == 0.8 and ci["lo"] == pytest.approx(0.4902, abs=1e-4) and ci["hi"] == pytest.approx(0.9433, abs=1e-4)
    assert _stats.wilson(10, 10)["hi"] == pytest.approx(1.0) and _stats.wilson(0, 10)["lo"] == pytest.approx(0.0)
    assert math.isnan(_stats.wilson(0, 0)["value"])


def test_bootstrap_intervals_hold_the_estimate_and_shrink_with_more_items():
    few, many = [1.0, 3.0] * 5, [1.0, 3.0] * 200
    small, large = _stats.mean_ci(few), _stats.mean_ci(many)
    assert small["lo"] < 2.0 < small["hi"] and large["hi"] - large["lo"] < small["hi"] - small["lo"]
    saving = _stats.saving_ci([10, 20, 30] * 10, [5, 10, 15] * 10)
    assert saving["value"] == pytest.approx(0.5) and saving["lo"] == pytest.approx(0.5)
    assert _stats.difference_ci([1, 0, 1, 1], [1, 0, 0, 1])["value"] == pytest.approx(-0.25)


def item(i, answer, reasoning, correct=False, probes=0):
    return ItemResult(f"t{i}", "arithmetic", answer, reasoning, reasoning + 3, 2 * probes, probes, 0.5,
                      "gravity" if probes else "model_ended", bool(probes), correct)


TASKS = [Task(f"t{i}", "arithmetic", f"q{i}?", "4", "number") for i in range(4)]


def test_summary_counts_probe_tokens_as_spent_and_preservation_against_the_full_run():
    full = [item(i, "4", 100, correct=True) for i in range(4)]
    ours = [item(0, "4", 40, True, probes=2), item(1, "4", 40, True), item(2, "5", 40), item(3, "4", 40, True)]
    s = summarize(TASKS, full, ours, wall=2.0)
    assert s["reasoning_saved"]["value"] == pytest.approx(0.6)
    assert s["spent_tokens"]["value"] == pytest.approx(43 + 4 / 4)
    assert s["preservation"]["value"] == 0.75 and s["accuracy"]["value"] == 0.75
    assert s["accuracy_change"]["value"] == pytest.approx(-0.25) and s["probes_total"] == 2
    assert s["reasons"] == {"gravity": 1, "model_ended": 3}


def fake_method(spent, accuracy, saved=0.5, kept=1.0, change=0.0):
    v = lambda x: {"value": x, "lo": x, "hi": x}  # noqa: E731
    return {"spent_tokens": v(spent), "accuracy": v(accuracy), "reasoning_saved": v(saved), "preservation": v(kept),
            "accuracy_change": v(change), "reasoning_tokens": v(spent), "seconds_per_item": v(1.0),
            "probes_total": 0, "free_text_preservation": v(kept)}


def test_goal_names_each_part_and_any_baseline_that_dominates():
    met = goal({"full": fake_method(100, 0.5, 0), "default": fake_method(50, 0.5, 0.5, 0.96),
                "dynasor": fake_method(60, 0.5)})
    assert met["met"] and not met["dominated_by"]
    missed = goal({"full": fake_method(100, 0.5, 0), "default": fake_method(50, 0.4, 0.3, 0.9, -0.1),
                   "vllm_budget": fake_method(40, 0.45)})
    assert not missed["met"] and missed["dominated_by"] == ["vllm_budget"]
    assert not missed["reasoning_saved_at_least_40pct"] and not missed["preservation_at_least_95pct"]
    assert not missed["accuracy_loss_at_most_1pt"]
    assert goal({"default": fake_method(1, 1)}) == {"checked": False,
                                                    "why": "needs the full and default methods in one run"}


def test_table_and_plot_show_every_method(tmp_path):
    methods = {"full": fake_method(100, 0.5, 0), "default": fake_method(50, 0.5), "dynasor": fake_method(70, 0.5)}
    report = {"model": "m", "items": 4, "methods": methods, "goal": goal(methods)}
    text = savings.table(report)
    assert all(name in text for name in methods) and "goal for 'default': met" in text
    assert savings.plot(report, tmp_path / "s.png").stat().st_size > 1000


def test_every_method_the_cli_offers_exists_and_is_valid():
    assert set(savings.method_configs(GravityConfig())) == set(_SAVINGS_METHODS)


def test_unknown_or_unanchored_methods_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown methods"):
        savings.run(None, TASKS, ["full", "magic"], 1, lambda n: None)
    with pytest.raises(ValueError, match="add 'default'"):
        savings.run(None, TASKS, ["full", "vllm_budget"], 1, lambda n: None)


class Recorder:
    provider, model_name, max_context, eos_ids, token_texts = "fake", "m", 10, (0,), ["a"]
    render = encode = decode = staticmethod(lambda *a: [])

    def __init__(self):
        self.seen = []

    def stream(self, request):
        self.seen.append(request)
        return iter(())

    astream = stream


def test_thinking_budget_backend_caps_every_request_and_changes_nothing_else():
    inner = Recorder()
    request = GenerationRequest([1, 2], SamplingSettings(max_tokens=9, temperature=0.5))
    ThinkingBudgetBackend(inner, 17).stream(request)
    sent = inner.seen[0]
    assert sent.sampling.thinking_token_budget == 17
    assert dataclasses.replace(sent.sampling, thinking_token_budget=None) == request.sampling
    assert ReasoningFormat().engine_markers() == ("<think>", "</think>\nAnswer:")


def test_budgets_default_to_gravity_configs_and_bad_ones_are_refused_before_any_engine_starts():
    from agent_gravity._cli import _budgets, build_parser, main

    assert _budgets(build_parser().parse_args(["calibrate"])) == Budgets() == Budgets(
        GravityConfig().max_reasoning_tokens, GravityConfig().max_answer_tokens)
    assert _budgets(build_parser().parse_args(["bench", "route", "--max-answer-tokens", "32"])) == Budgets(answer=32)
    assert Budgets(64, 32).apply(GravityConfig(enabled=False)).model_dump() == GravityConfig(
        enabled=False, max_reasoning_tokens=64, max_answer_tokens=32).model_dump()
    assert main(["bench", "savings", "--max-reasoning-tokens", "8"]) == 2  # below min_tokens: gravity could never fire
    with pytest.raises(SystemExit):
        build_parser().parse_args(["calibrate", "--max-answer-tokens", "0"])
    with pytest.raises(SystemExit, match="--layers .* takes no --max-\\*-tokens"):
        main(["calibrate", "--layers", "--max-answer-tokens", "32"])
    assert Budgets(64, 32).apply_all({"full": GravityConfig(enabled=False)}) == {"full": Budgets(64, 32).full()}
