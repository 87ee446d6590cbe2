"""``bench prefill``: seeded long-context tasks bury their values where they say, and the benchmark runs end to end
on the transformers backend in a reduced size."""

from __future__ import annotations

import json

import pytest

from agent_gravity._cli import main
from agent_gravity.bench.prefill_tasks import KINDS, generate_prefill_tasks


def _words(text: str) -> int:
    return len(text.split())


def test_tasks_reach_their_length_and_bury_each_value_at_its_depth():
    tasks = generate_prefill_tasks([512, 2048], _words, per_cell=2)
    assert len(tasks) == 2 * 3 * len(KINDS) * 2 and len({t.id for t in tasks}) == len(tasks)
    for task in tasks:
        document = task.messages[0]["content"]
        assert task.tokens - 96 <= _words(document) <= task.tokens + 40
        lines = document.split("\n\n")[0].split("\n")  # the document, before the question
        where = next(i for i, line in enumerate(lines) if task.value in line) / len(lines)
        assert abs(where - task.depth) <= 1.5 / len(lines) and document.count(task.value) == 1
        if task.kind == "two_hop":
            host = next(line for line in lines if "runs on host" in line).rsplit(" ", 1)[1]
            assert f"host {host} is {task.value}" in document and host not in task.prefix
    assert generate_prefill_tasks([512], _words) == generate_prefill_tasks([512], _words)  # seeded
    with pytest.raises(ValueError, match="unknown prefill task kinds"):
        generate_prefill_tasks([512], _words, kinds=["poems"])


@pytest.mark.engine
def test_bench_prefill_reports_speed_recall_and_agreement_against_dense_and_fixed_patterns(tmp_path, capsys):
    assert main(["bench", "prefill", "--lengths", "512", "1024", "--kinds", "two_hop", "--min-tokens", "256",
                 "--break-even", "512", "1024", "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "break-even" in table and "goal at 1024 tokens" in table
    report = json.loads((tmp_path / "prefill.json").read_text())
    assert list(report["methods"]) == ["dense", "adaptive", "streaming", "duo"]
    dense = report["methods"]["dense"]["all"]
    assert dense["agreement"]["value"] == 1.0 and dense["kl"]["value"] == 0.0 and dense["items"] == 2 * 3
    for name in ("adaptive", "streaming", "duo"):
        m = report["methods"][name]["all"]
        assert m["attention_share"]["value"] > 0 and 0 <= m["agreement"]["value"] <= 1 and m["kl"]["value"] >= 0
    # sinks and a window cut most products; adaptive pays its estimate on prompts this short
    assert report["methods"]["streaming"]["all"]["attention_share"]["value"] < 1.0
    assert report["duo_dense_heads"] >= 1 and set(report["break_even"]["speedup"]) == {"512", "1024"}
    adaptive = [r for r in report["rows"] if r["method"] == "adaptive"]
    assert all(r["prefill_s"] > 0 and r["ttft_s"] >= r["prefill_s"] for r in adaptive)
    assert (tmp_path / "prefill.png").stat().st_size > 1000
