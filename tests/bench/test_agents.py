"""bench agents: the tools, the seeded tasks, the answer rule, the statistics and a reduced real run."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agent_gravity._cli import main
from agent_gravity.bench.agent_tasks import (
    STOCK,
    FinalAnswer,
    answer_number,
    calculator,
    evaluate,
    generate_agent_tasks,
    lookup,
)
from agent_gravity.bench.agents import TaskResult, final_answer, summarize, table


def test_the_calculator_evaluates_arithmetic_and_nothing_else():
    assert evaluate("3 * (8 - 2) / 4") == 4.5 and calculator.invoke({"expression": "42 + 17"}) == "59"
    for bad in ("__import__('os')", "2 ** 8", "1 / 0"):
        with pytest.raises(ValueError):
            evaluate(bad)
    with pytest.raises(ValueError):  # the tool's schema refuses words before it runs
        calculator.invoke({"expression": "apples + 1"})


def test_lookup_reads_the_table_and_its_schema_lists_the_items():
    assert lookup.invoke({"item": "apples"}) == "apples: 42 in stock"
    assert lookup.args["item"]["enum"] == list(STOCK)


def test_tasks_are_seeded_multi_step_and_answered_by_the_table():
    tasks = generate_agent_tasks(60)
    assert tasks == generate_agent_tasks(60) and tasks != generate_agent_tasks(60, seed=8)
    assert len({t.id for t in tasks}) == 60
    assert {t.id.split("-")[0] for t in tasks} == {"sum", "times", "diff", "lookup"}
    for t in tasks:
        words = t.question.split()
        items = [w for w in words if w in STOCK]
        if t.id.startswith("sum"):
            assert int(t.answer) == STOCK[items[0]] + STOCK[items[1]]
        if t.id.startswith("lookup"):
            assert int(t.answer) == STOCK[items[0]]
    with pytest.raises(ValueError, match="at least 1"):
        generate_agent_tasks(0)


def test_the_final_answer_rule_is_one_for_both_arms():
    q = HumanMessage("q")
    reply = AIMessage("", tool_calls=[{"name": "lookup", "args": {"item": "figs"}, "id": "1", "type": "tool_call"}],
                      usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2})
    result = ToolMessage("figs: 29 in stock", tool_call_id="1")
    limit = AIMessage("Model call limits exceeded: run limit (8/8)")
    assert final_answer({"messages": [q, reply, result, limit]}) == "figs: 29 in stock"
    assert final_answer({"messages": [q], "structured_response": FinalAnswer(answer=29)}) == "29.0"
    assert final_answer({"messages": [q], "gravity": {"answer": "29", "reason": "repeated_tool_call"}}) == "29"
    stopped = {"answer": "Model call limits exceeded", "reason": "stopped_by_agent"}
    assert final_answer({"messages": [q, reply, result, limit], "gravity": stopped}) == "figs: 29 in stock"
    assert answer_number("figs: 29 in stock") == "29" == answer_number("29.0")


def test_summary_reports_savings_and_agreement_with_intervals():
    base = [TaskResult(str(i), "29", True, 8, 80, 800, 2.0, None) for i in range(10)]
    grav = [TaskResult(str(i), "29" if i else "7", i > 0, 2, 20, 200, 0.5, "repeated_tool_call") for i in range(10)]
    report = summarize(base, grav)
    assert report["savings"]["calls_saved"]["value"] == pytest.approx(0.75)
    assert report["savings"]["agreement"]["value"] == pytest.approx(0.9)
    assert report["goal"] == {"tokens_saved": True, "calls_saved": True, "agreement": False, "met": False}
    assert report["reasons"] == {"repeated_tool_call": 10}
    assert report["savings"]["accuracy_change"]["value"] == pytest.approx(-0.1)
    assert "agreement 90.0" in table(report)
    empty = [TaskResult("0", "", False, 8, 80, 800, 2.0, None)]
    assert summarize(empty, empty)["savings"]["agreement"]["value"] == 0, "no answer on both sides is no agreement"


def test_bad_bench_arguments_are_refused():
    with pytest.raises(SystemExit, match="--tasks"):
        main(["bench", "agents", "--tasks", "0"])
    with pytest.raises(SystemExit, match="--low-entropy-steps"):
        main(["bench", "agents", "--low-entropy-steps", "0"])


def test_a_reduced_run_compares_both_arms_on_the_real_engine(chat, capsys, tmp_path):
    assert main(["bench", "agents", "--tasks", "4", "--max-steps", "3", "--json", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["arms"]) == {"baseline", "gravity"} and report["settings"]["tasks"] == 4
    for arm in report["arms"].values():
        assert 1 <= arm["model_calls"]["value"] <= 3 and arm["output_tokens"]["value"] > 0
    saved = report["savings"]["calls_saved"]
    assert saved["lo"] <= saved["value"] <= saved["hi"] and 0 <= report["savings"]["agreement"]["value"] <= 1
    assert (tmp_path / "agents.json").exists() and (tmp_path / "agents.png").stat().st_size > 0
