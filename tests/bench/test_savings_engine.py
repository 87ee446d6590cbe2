"""``bench savings`` and ``calibrate`` end to end on the real engine, in a reduced size."""

from __future__ import annotations

import json

import pytest

from agent_gravity import ChatGravity, GravityConfig
from agent_gravity._calibrate import GRID, candidates
from agent_gravity._cli import main
from agent_gravity._profile import load_profile
from agent_gravity.bench.savings import Budgets
from tests.bench import SMALL

pytestmark = pytest.mark.engine


def test_bench_savings_runs_every_kind_of_method_and_writes_table_json_and_plot(chat, tmp_path, capsys):
    methods = ["full", "loop", "default", "vllm_budget", "dynasor"]
    assert main(["bench", "savings", "--items", "4", "--free-text", "1", "--methods", *methods, *SMALL,
                 "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in methods) and "goal for 'default'" in table
    report = json.loads((tmp_path / "savings.json").read_text())
    assert all(c["max_reasoning_tokens"] == 64 and c["max_answer_tokens"] == 32 for c in report["configs"].values())
    assert report["items"] == 5 and report["free_text_items"] == 1 and list(report["methods"]) == [
        "full", "loop", "default", "dynasor", "vllm_budget"], "vllm_budget runs last: its cap is default's mean"
    full = report["methods"]["full"]
    assert full["preservation"]["value"] == 1.0 and full["reasoning_saved"]["value"] == 0.0
    for name, m in report["methods"].items():
        for key in ("reasoning_tokens", "spent_tokens", "accuracy", "preservation", "seconds_per_item"):
            assert m[key]["lo"] <= m[key]["value"] <= m[key]["hi"], (name, key)
        assert len(report["per_item"][name]) == 5
    assert report["methods"]["dynasor"]["probes_total"] > 0, "Dynasor probes on its schedule"
    budget = report["vllm_thinking_token_budget"]
    assert budget == max(1, round(report["methods"]["default"]["reasoning_tokens"]["value"]))
    assert all(r["reasoning_tokens"] <= budget + 1 for r in report["per_item"]["vllm_budget"]), "vLLM's cap held"
    assert report["goal"]["checked"] and (tmp_path / "savings.png").stat().st_size > 1000


def test_split_bench_calibrates_without_the_held_out_family_and_reports_every_family(chat, tmp_path, capsys):
    families = ["word_problems", "dates", "code_output"]
    assert main(["bench", "savings", "--tasks", "families", "--split", "leave-one-family-out", "--per-family", "2",
                 "--families", *families, "--epsilon", "0.5", "--delta", "0.5", *SMALL, "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert all(f in table for f in families) and "worst family" in table and "paraphrases" in table
    report = json.loads((tmp_path / "savings.json").read_text())
    assert report["items"] == 6 and report["families"] == sorted(families)
    assert {"full", "default", "dynasor", "vllm_budget", *(c.name for c in GRID)} == set(report["methods"])
    assert all(r["reasoning_tokens"] <= 64 for name in ("full", "default") for r in report["per_item"][name])
    assert all(r["reasoning_tokens"] <= 4 * 64 for r in report["references"].values())
    rows = report["split"]["families"]
    assert [r["family"] for r in rows] == families
    for r in rows:
        assert r["family"] not in r["calibration_families"] and r["calibration_items"] == 4 and r["items"] == 2
        assert r["chosen"] in {c.name for c in GRID}
        assert set(r["compared"]) == {"default", "dynasor", "vllm_budget"}
    ref = report["reference"]
    assert ref["settled_items"] + ref["capped_items"] == 6 and len(report["references"]) == ref["capped_items"]
    full = report["per_item"]["full"]
    assert {r["finish_reason"] for r in full} <= {"stop", "length"}
    assert {r["id"] for r in full if r["finish_reason"] == "length" or r["reason"] == "reasoning_budget"} == set(
        report["references"]), "every run that did not end by itself, and only those, has a reference"
    assert report["paraphrase"]["method"] == "default" and 0 <= report["paraphrase"]["pairs"] <= 3
    assert (tmp_path / "savings.png").stat().st_size > 1000


def test_calibrate_writes_a_profile_with_its_guarantee_that_chat_gravity_then_uses(chat, tmp_path, monkeypatch,
                                                                                   capsys):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    assert main(["calibrate", "--per-family", "2", "--families", "word_problems", "dates", "--candidates",
                 "careful", "default", "--epsilon", "0.9", "--delta", "0.5", *SMALL]) == 0
    assert "wrote" in capsys.readouterr().out
    profile = load_profile("SmolLM2-135M-Instruct")
    c = profile.calibration
    assert c is not None and c.items == 4 and c.families == ["dates", "word_problems"]
    assert (c.epsilon, c.delta) == (0.9, 0.5) and [t["name"] for t in profile.measured["tests"]] == ["careful",
                                                                                                      "default"]
    # at these loose levels a candidate is certified on 4 items: the profile carries its settings
    assert c.bound_met and c.candidate in ("careful", "default") and c.bound <= c.epsilon
    assert profile.gravity == Budgets(64, 32).apply(candidates(GravityConfig())[c.candidate]), "as certified"
    model = ChatGravity()
    assert model.gravity == profile.gravity
    risk = model.invoke("What is 2 + 3?").response_metadata["gravity"]["risk"]
    assert risk["epsilon"] == 0.9 and risk["delta"] == 0.5 and risk["profile"].endswith("SmolLM2-135M-Instruct.json")
