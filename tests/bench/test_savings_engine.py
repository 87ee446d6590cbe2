"""``bench savings`` and ``calibrate`` end to end on the real engine, in a reduced size."""

from __future__ import annotations

import json

import pytest

from agent_gravity import ChatGravity
from agent_gravity._cli import main
from agent_gravity._profile import load_profile

pytestmark = pytest.mark.engine


def test_bench_savings_runs_every_kind_of_method_and_writes_table_json_and_plot(chat, tmp_path, capsys):
    methods = ["full", "loop", "default", "vllm_budget", "dynasor"]
    assert main(["bench", "savings", "--items", "4", "--free-text", "1", "--methods", *methods,
                 "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in methods) and "goal for 'default'" in table
    report = json.loads((tmp_path / "savings.json").read_text())
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


def test_calibrate_writes_a_profile_that_chat_gravity_then_uses(chat, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AGENT_GRAVITY_PROFILES", str(tmp_path))
    assert main(["calibrate", "--items", "3", "--free-text", "0", "--factors", "1", "3", "--target", "0.5"]) == 0
    assert "wrote" in capsys.readouterr().out
    profile = load_profile("SmolLM2-135M-Instruct")
    assert profile is not None and profile.measured["items"] == 3
    assert set(profile.measured["candidates"]) == {"x1", "x3"} and profile.measured["candidate"] in ("x1", "x3")
    assert ChatGravity().gravity == profile.gravity
