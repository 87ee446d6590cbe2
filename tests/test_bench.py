"""The benchmarks run end to end in a reduced size and write their table, JSON and plot."""

from __future__ import annotations

import json

import pytest
import torch

from agent_gravity._cli import main
from agent_gravity.bench import kernels


def test_bench_kernels_times_every_variant_it_can_run(tmp_path):
    report = kernels.run(torch.device("cpu"), torch.float32, repeats=2, shapes=((2, 4099),))
    assert {r["impl"] for r in report["rows"]} == {"torch eager", "torch.compile"}  # no CUDA, no Triton
    assert all(r["us"] > 0 and r["gb_s"] > 0 and r["of_copy"] is None for r in report["rows"])
    assert "the Triton kernel is not timed" in kernels.table(report)
    assert kernels.plot(report, tmp_path / "k.png").stat().st_size > 1000


@pytest.mark.engine
def test_bench_overhead_reports_a_ratio_per_batch_size(chat, tmp_path, capsys):
    assert main(["bench", "overhead", "--batch", "1", "2", "--rounds", "2", "--tokens", "6",
                 "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "overhead.json").read_text())
    assert set(report["batches"]) == {"1", "2"}
    for row in report["batches"].values():
        assert row["ratio"]["n"] == 2 and 0.2 < row["ratio"]["median"] < 5
        assert all(set(p) == {"baseline", "gravity"} for p in row["rounds"])
    assert (tmp_path / "overhead.png").stat().st_size > 1000
    assert "slowdown" in capsys.readouterr().out
