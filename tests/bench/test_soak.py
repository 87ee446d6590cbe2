"""bench soak: every request accounted for; a reply carrying another's report counts as crossed."""

from __future__ import annotations

import json

import pytest

from agent_gravity.bench.soak import KINDS, Outcome, _judge, main, plan, summarize, table


def _reply(tokens: int, entropies: int, finish: str = "length", message: dict | None = None) -> dict:
    return {"choices": [{"finish_reason": finish, "message": message or {"content": "1, 2"}}],
            "usage": {"completion_tokens": tokens}, "gravity": {"entropy": [0.1] * entropies}}


def test_the_plan_is_seeded_and_mixes_every_kind():
    kinds = plan(2000, seed=0)
    assert kinds == plan(2000, seed=0) and set(kinds) == set(KINDS)
    assert 150 <= kinds.count("leave") <= 250 and 60 <= kinds.count("bad") <= 140


def test_a_reply_is_judged_its_own_only_when_its_trace_and_length_are():
    assert _judge("plain", 0, _reply(4, 4)) == ("completed", None)  # request 0 asks for 4 tokens
    assert _judge("plain", 0, _reply(4, 5))[0] == "crossed"
    assert _judge("plain", 1, _reply(4, 4))[0] == "crossed"  # request 1 asked for 5
    call = {"tool_calls": [{"function": {"name": "lookup", "arguments": json.dumps({"item": "limes"})}}]}
    assert _judge("tools", 3, _reply(9, 9, "tool_calls", call))[0] == "completed"
    assert _judge("tools", 3, _reply(9, 9, "stop"))[0] == "lost"
    assert _judge("structured", 3, _reply(5, 5, "stop", {"content": '{"answer": 42}'}))[0] == "completed"
    assert _judge("structured", 3, _reply(5, 5, "stop", {"content": "{}"}))[0] == "lost"


def test_the_summary_counts_every_status_and_whether_memory_levelled_off():
    outcomes = [Outcome(0, "plain", "completed", 1.0), Outcome(1, "leave", "left", 0.1),
                Outcome(2, "bad", "refused", 0.01), Outcome(3, "stream", "crossed", 2.0, "7 entropies for 9"),
                Outcome(4, "tools", "lost", error="HTTP 502")]
    mb = 2**20
    report = summarize(outcomes, [(0, 0, 100 * mb), (1, 2, 150 * mb), (2, 5, 151 * mb)], 2.0, 4)
    assert [report[k] for k in ("completed", "left", "refused", "lost", "crossed")] == [1, 1, 1, 1, 1]
    assert report["goal"] == {"lost": False, "crossed": False, "memory_levels_off": True}
    growing = summarize(outcomes, [(0, 0, 100 * mb), (1, 2, 150 * mb), (2, 5, 200 * mb)], 2.0, 4)
    assert not growing["goal"]["memory_levels_off"]
    assert "lost 1, crossed 1" in table(report) and "HTTP 502" in table(report)


@pytest.mark.engine
def test_a_short_soak_on_the_real_engine_loses_and_crosses_nothing(chat, tmp_path):
    report = main(tmp_path, requests=48, concurrency=8, seed=3)
    assert report["lost"] == 0 and report["crossed"] == 0, report["errors"]
    assert report["left"] > 0 and report["refused"] > 0
    assert set(report["completed_by_kind"]) == {"plain", "stream", "tools", "structured"}
    assert report["warm_up"] == ["completed"] * 3
    assert (tmp_path / "soak.json").exists() and (tmp_path / "soak.png").stat().st_size > 10_000
