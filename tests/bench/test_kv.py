"""bench kv: transcripts, budgets, the recall rule, the summary, and a reduced real run."""

from __future__ import annotations

import json

import pytest
import torch

from agent_gravity._cli import _KV_POLICIES, main
from agent_gravity.backends._ragged_cache import packed_share
from agent_gravity.bench import kv
from agent_gravity.bench.kv_tasks import FAMILIES, generate_transcripts
from agent_gravity.trim import TrimBudgetError


def test_transcripts_are_seeded_and_bury_one_value_per_tool_output():
    ts = generate_transcripts(4)
    assert ts == generate_transcripts(4) and ts != generate_transcripts(4, seed=12)
    assert {t.family for t in ts} == {"logs"} and ts[0].id == "logs-t0"
    for t in ts:
        assert [q.turn for q in t.questions] == ["early", "middle", "late"]
        outputs = [m["content"] for m in t.messages if m["content"].startswith("Tool output:")]
        assert len(outputs) == 3 and all(q.value in o for q, o in zip(t.questions, outputs))
        assert all(q.prefix.startswith("The ") and q.value not in q.prefix for q in t.questions)
    with pytest.raises(ValueError, match="at least 1 transcript"):
        generate_transcripts(0)


def test_every_family_words_its_transcripts_its_own_way():
    ts = generate_transcripts(2, families=list(FAMILIES))
    assert [t.family for t in ts] == [*FAMILIES, *FAMILIES] and len({t.id for t in ts}) == len(ts)
    for t in ts:
        outputs = t.messages[3::2][:3]  # system, task, then each call and its tool output
        assert [m["role"] for m in outputs] == ["user"] * 3
        for q, out in zip(t.questions, outputs):
            # the value sits in its own turn's output only, and the answer's opening words lead straight to it
            assert q.value in out["content"] and sum(q.value in m["content"] for m in t.messages) == 1
            assert q.value not in q.question + q.prefix and " " not in q.value
            assert kv.recalled(f" {q.value}.", q.value)
    systems = {t.family: t.messages[0]["content"] for t in ts}
    questions = {t.family: t.questions[0].question.split()[0] for t in ts}
    assert len(set(systems.values())) == len(FAMILIES) and len(set(questions.values())) > 2
    with pytest.raises(ValueError, match="unknown transcript families .'yaml'.; known"):
        generate_transcripts(1, families=["logs", "yaml"])


def test_budgets_leave_the_sinks_and_window_and_say_when_they_cannot():
    assert kv.stretch_ratio(1000, 964, 1000 / 4) == pytest.approx((1000 - 36) / (250 - 36))
    assert kv.stretch_ratio(100, 64, 100) == 1.0
    assert kv.stretch_ratio(600, 300, 400) == pytest.approx(3.0)  # 8-bit zones hold 300 bytes no trim touches
    # kept entries stored in 8 bits hold 144 of their 520 bytes (64-dim float32 keys and values, a position)
    assert packed_share(64, torch.float32, 8) == pytest.approx(144 / 520)
    # a trim's keys take a scale per channel per 64 entries instead: the same bytes, and a block count per 64
    assert packed_share(64, torch.float32, 8, key_block=64) == pytest.approx((144 + 4 / 64) / 520)
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


def _rows(family: str = "logs", full_recall: bool = True, agreement: float = 0.9) -> list[dict]:
    """Two transcripts of one family: ours misses the early value, SnapKV all but the late one, StreamingLLM
    recalls what ours does at a higher agreement."""
    rows = []
    for t in ("t0", "t1"):
        for turn in ("early", "middle", "late"):
            base = {"transcript": f"{family}-{t}", "family": family, "turn": turn, "value": "1", "answer": "1",
                    "full_recall": full_recall}
            rows.append({**base, "method": "full", "budget": 1, "mode": "unknown", "bytes": 800,
                         "recall": full_recall, "agreement": 1.0, "seconds": 0.5, "trim_seconds": 0.0})
            rows.append({**base, "method": "reconstruction_int8", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn != "early", "agreement": agreement, "seconds": 0.4, "trim_seconds": 0.1})
            rows.append({**base, "method": "snapkv", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn == "late", "agreement": agreement, "seconds": 0.4, "trim_seconds": 0.1})
            rows.append({**base, "method": "streaming_llm", "budget": 4, "mode": "unknown", "bytes": 200,
                         "recall": turn != "early", "agreement": 0.95, "seconds": 0.4, "trim_seconds": 0.1})
    return rows


def test_summary_has_intervals_over_transcripts_and_checks_the_goal():
    rows = _rows()
    report = kv.summarize(rows)
    ours = next(m for m in report["methods"] if m["method"] == "reconstruction_int8")
    assert ours["bytes_ratio"]["value"] == pytest.approx(4.0) and ours["recall"]["value"] == pytest.approx(2 / 3)
    assert ours["recall_by_turn"] == {"early": 0.0, "middle": 1.0, "late": 1.0}
    assert report["goal"] == {"checked": True, "method": "reconstruction_int8", "budget": 4, "unknown": {
        "recall": False, "agreement": True, "beats": {"snapkv": True, "streaming_llm": False}}}
    table = kv.table(report)
    assert "goal (reconstruction_int8, 4x, unknown): recall NOT met, agreement met, beats snapkv yes, beats " \
           "streaming_llm no" in table and report["unreachable"] == []
    assert "families" not in report and "by transcript family" not in table  # one family: no split
    rows.append({"transcript": "logs-t0", "family": "logs", "method": "head_entropy_int8", "budget": 8,
                 "mode": "unknown", "unreachable": "8-bit zones hold more"})
    report = kv.summarize(rows)
    assert report["unreachable"] == [{"method": "head_entropy_int8", "budget": 8, "mode": "unknown"}]
    assert "head_entropy_int8         8  unknown   unreachable" in kv.table(report)


def test_several_families_are_summarised_each_and_the_worst_family_is_named():
    report = kv.summarize(_rows() + _rows("json", full_recall=False, agreement=0.8))
    assert set(report["families"]) == {"logs", "json"}
    json_ours = next(m for m in report["families"]["json"]["methods"] if m["method"] == "reconstruction_int8")
    assert json_ours["agreement"]["value"] == pytest.approx(0.8)  # from json's rows only
    worst = report["worst_family"]["unknown"]
    assert worst["recall_of_full"] == {"family": "logs", "value": pytest.approx(2 / 3)}
    assert worst["agreement"] == {"family": "json", "value": pytest.approx(0.8)}
    assert worst["no_full_recall"] == ["json"] and worst["goal_met_everywhere"] is False
    table = kv.table(report)
    assert "json     reconstruction_int8       4  unknown         66.7 (0.0)           80.0" in table
    assert ("worst family (reconstruction_int8, 4x, unknown): recall 66.7% of the full cache's (logs), agreement "
            "80.0% (json); the full cache recalls nothing in json; goal met in every family: no") in table


def test_a_reduced_run_on_the_real_model(capsys, tmp_path):
    pytest.importorskip("transformers")
    args = ["bench", "kv", "--transcripts", "1", "--families", "logs", "--noise-lines", "12", "--budgets", "2",
            "--policies", "head_entropy", "reconstruction_int8", "head_entropy_int8", "int8_gravity", "--json",
            "--out", str(tmp_path)]
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
