"""bench kv: transcripts, budgets, the recall rule, the summary, and a reduced real run."""

from __future__ import annotations

import json

import pytest
import torch

from agent_gravity._cli import _KV_POLICIES, main
from agent_gravity.backends._ragged_cache import packed_share
from agent_gravity.bench import kv
from agent_gravity.bench.kv_tasks import generate_transcripts
from agent_gravity.trim import TrimBudgetError


def test_transcripts_are_seeded_and_bury_one_value_per_tool_output():
    ts = generate_transcripts(4)
    assert ts == generate_transcripts(4) and ts != generate_transcripts(4, seed=12)
    for t in ts:
        assert [q.turn for q in t.questions] == ["early", "middle", "late"]
        outputs = [m["content"] for m in t.messages if m["content"].startswith("Tool output:")]
        assert len(outputs) == 3 and all(q.value in o for q, o in zip(t.questions, outputs))
        assert all(q.prefix.startswith("The ") and q.value not in q.prefix for q in t.questions)
    with pytest.raises(ValueError, match="at least 1 transcript"):
        generate_transcripts(0)


def test_budgets_leave_the_sinks_and_window_and_say_when_they_cannot():
    assert kv.stretch_ratio(1000, 964, 1000 / 4) == pytest.approx((1000 - 36) / (250 - 36))
    assert kv.stretch_ratio(100, 64, 100) == 1.0
    assert kv.stretch_ratio(600, 300, 400) == pytest.approx(3.0)  # 8-bit zones hold 300 bytes no trim touches
    # kept entries stored in 8 bits hold 144 of their 520 bytes (64-dim float32 keys and values, a position)
    assert packed_share(64, torch.float32, 8) == pytest.approx(144 / 520)
    ratio = kv.stretch_ratio(1000, 964, 250, 144 / 520)
    assert 1000 - 964 + 964 / ratio * 144 / 520 == pytest.approx(250)  # what stays, packed, meets the budget
    assert kv.stretch_ratio(1000, 964, 500, 144 / 520) == 1.0  # 8 bits alone are under budget: nothing evicted
    with pytest.raises(TrimBudgetError, match="the 4 sinks, the 32-token window .and any 8-bit zones. hold more"):
        kv.stretch_ratio(200, 164, 200 / 8)


def test_recall_is_the_exact_value_as_the_first_word():
    assert kv.recalled(" K7Q2X9.", "K7Q2X9") and not kv.recalled(" K7Q2X8", "K7Q2X9")
    assert not kv.recalled(" 76563.", "T-76563") and not kv.recalled("", "x")


def test_the_cli_lists_the_benchmarks_policies_and_refuses_bad_budgets():
    assert set(_KV_POLICIES) == set(kv.POLICIES)
    with pytest.raises(SystemExit, match="--budgets"):
        main(["bench", "kv", "--budgets", "1"])


def test_summary_has_intervals_over_transcripts_and_checks_the_goal():
    rows = []
    for t in ("t0", "t1"):
        for turn in ("early", "middle", "late"):
            base = {"transcript": t, "turn": turn, "value": "1", "answer": "1", "full_recall": True}
            rows.append({**base, "method": "full", "budget": 1, "mode": "unknown", "bytes": 800, "recall": True,
                         "agreement": 1.0, "seconds": 0.5, "trim_seconds": 0.0})
            rows.append({**base, "method": "reconstruction_int8", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn != "early", "agreement": 0.9, "seconds": 0.4, "trim_seconds": 0.1})
            rows.append({**base, "method": "snapkv", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn == "late", "agreement": 0.9, "seconds": 0.4, "trim_seconds": 0.1})
            rows.append({**base, "method": "streaming_llm", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn != "early", "agreement": 0.95, "seconds": 0.4, "trim_seconds": 0.1})
    report = kv.summarize(rows)
    ours = next(m for m in report["methods"] if m["method"] == "reconstruction_int8")
    assert ours["bytes_ratio"]["value"] == pytest.approx(4.0) and ours["recall"]["value"] == pytest.approx(2 / 3)
    assert ours["recall_by_turn"] == {"early": 0.0, "middle": 1.0, "late": 1.0}
    assert report["goal"] == {"checked": True, "method": "reconstruction_int8", "budget": 4, "unknown": {
        "recall": False, "agreement": True, "beats": {"snapkv": True, "streaming_llm": False}}}
    table = kv.table(report)
    assert "goal (reconstruction_int8, 4x, unknown): recall NOT met, agreement met, beats snapkv yes, beats " \
           "streaming_llm no" in table and report["unreachable"] == []
    rows.append({"transcript": "t0", "method": "head_entropy_int8", "budget": 8, "mode": "unknown",
                 "unreachable": "8-bit zones hold more"})
    report = kv.summarize(rows)
    assert report["unreachable"] == [{"method": "head_entropy_int8", "budget": 8, "mode": "unknown"}]
    assert "head_entropy_int8         8  unknown   unreachable" in kv.table(report)


def test_a_reduced_run_on_the_real_model(capsys, tmp_path):
    pytest.importorskip("transformers")
    args = ["bench", "kv", "--transcripts", "1", "--noise-lines", "12", "--budgets", "2", "--policies",
            "head_entropy", "reconstruction_int8", "head_entropy_int8", "int8_gravity", "--json", "--out",
            str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    methods = {(m["method"], m["budget"], m["mode"]) for m in report["methods"]}
    trims = ("head_entropy", "reconstruction_int8", "head_entropy_int8")
    assert methods == {("full", 1, "unknown"), *((p, 2, mode) for p in trims for mode in ("unknown", "known")),
                       ("int8_gravity", 1, "unknown"), ("int8_gravity", 1, "known")}
    for m in report["methods"]:
        assert 0 <= m["recall"]["value"] <= 1 and 0 <= m["agreement"]["value"] <= 1
        if m["method"] in ("head_entropy", "head_entropy_int8"):
            assert 1.6 < m["bytes_ratio"]["value"] < 2.4
    # what the trim keeps in 8 bits: at 2x packing alone is under budget (ratio 1), so it goes further and keeps
    # the answers
    kept8 = [m for m in report["methods"] if m["method"] == "reconstruction_int8"]
    assert all(m["bytes_ratio"]["value"] > 2.4 and m["agreement"]["value"] >= 0.9 for m in kept8)
    # 8 bits instead of eviction: fewer bytes than the full cache, the same top-1 tokens.
    zones = next(m for m in report["methods"] if m["method"] == "int8_gravity" and m["mode"] == "unknown")
    assert zones["bytes_ratio"]["value"] > 1.1 and zones["agreement"]["value"] == 1.0
    assert (tmp_path / "kv.json").exists() and (tmp_path / "kv.png").stat().st_size > 0
