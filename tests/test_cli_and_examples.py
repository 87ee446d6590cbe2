"""The demo command and the examples, run for real on the shared engine."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest

from agent_gravity._cli import main
from agent_gravity._demo import DemoRun, as_table

pytestmark = pytest.mark.engine
EXAMPLES = Path(__file__).parent.parent / "examples"


def test_demo_json_shows_gravity_saving_tokens_with_answers_kept(chat, capsys):
    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "vllm" and out["model"] == "SmolLM2-135M-Instruct"
    runs = out["runs"]
    assert {r["mode"] for r in runs} == {"baseline", "gravity"} and len(runs) % 2 == 0
    for run in runs:
        assert set(run) == {"question", "mode", "answer", "tokens", "reasoning_tokens", "terminated_early",
                            "reason", "wall_s", "entropy"}
        assert len(run["entropy"]) == run["tokens"] and run["wall_s"] > 0
        assert run["reason"] in ("gravity", "loop", "model_ended", "reasoning_budget")
    pairs = list(zip(runs[::2], runs[1::2]))
    assert all(b["question"] == g["question"] for b, g in pairs)
    assert all(g["answer"] for _, g in pairs)
    assert any(g["terminated_early"] and g["tokens"] < b["tokens"] for b, g in pairs)


def test_quickstart_example_runs(chat, capsys):
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "gravity on : answer=" in out and "gravity off: answer=" in out


def test_policies_example_runs_every_configuration(chat, capsys):
    runpy.run_path(str(EXAMPLES / "policies.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("answer=") == 3 and "periodic probes only" in out and "why: " in out


def test_chain_example_runs_prompt_model_parser(chat, capsys):
    runpy.run_path(str(EXAMPLES / "chain.py"), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(" -> " in line and line.split(" -> ")[1] for line in lines)


def test_agent_example_ends_the_loop_early_with_the_middleware(chat, capsys):
    runpy.run_path(str(EXAMPLES / "agent_tools.py"), run_name="__main__")
    without, with_ = capsys.readouterr().out.strip().splitlines()
    calls = [int(line.split(": ")[1].split(" model calls")[0]) for line in (without, with_)]
    assert with_.startswith("with GravityMiddleware") and "why=" in with_
    assert calls[1] <= calls[0]


def test_loop_decorator_example_reports_answer_reason_and_steps(chat, capsys, spans):
    runpy.run_path(str(EXAMPLES / "loop_decorator.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "answer=" in out and "reason=" in out and "steps_saved=" in out
    finished = spans.get_finished_spans()
    agent, = [s for s in finished if s.name == "invoke_agent solve"]
    children = [s for s in finished if s.parent and s.parent.span_id == agent.context.span_id]
    assert any(s.name.startswith("chat ") for s in children)
    assert all(s.name.startswith(("chat ", "execute_tool ")) for s in children)


def test_table_puts_baseline_and_gravity_side_by_side():
    runs = [DemoRun("Q one?", "baseline", "8", 40, 30, False, "model_ended", 2.0, [0.1] * 40),
            DemoRun("Q one?", "gravity", "8", 20, 10, True, "gravity", 1.0, [0.1] * 20,
                    detail="window_mean locked at token 9")]
    table = as_table(runs)
    assert "Q one?" in table and "ended early: window_mean locked at token 9" in table
    assert "baseline 40, gravity 20 (50% fewer)" in table
