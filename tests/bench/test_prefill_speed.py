"""bench prefill-speed, the prepared GPU run (tests/gpu/run_on_device.sh): its CPU twin on a one-layer random
model, its refusals, and its GPU run where there is a GPU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from agent_gravity._cli import main


def _run(tmp_path, capsys, *extra: str) -> dict:
    assert main(["bench", "prefill-speed", "--layers", "1", "--repeats", "1", "--json", "--out", str(tmp_path),
                 *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_cpu_twin_times_dense_and_both_adaptive_arms(tmp_path, capsys):
    report = _run(tmp_path, capsys, "--lengths", "1024", "--device", "cpu")
    (row,) = report["rows"]
    assert row["tokens"] == 1024 and row["dense_s"] > 0
    # 75% of the heads sparse in the second of two segments (the first has nothing before it)
    assert row["fixed"]["sparse_share"] == pytest.approx(0.75 / 2) and row["fixed"]["attention_share"] < 1
    assert row["estimate"]["speedup"] > 0 and report["goal"] == {"checked": False, "met": False}
    assert report["settings"]["layers"] == 1 and (tmp_path / "prefill_speed.png").stat().st_size > 0


def test_bad_options_are_refused():
    for bad in (["--lengths", "512"], ["--sparse-share", "1.5"], ["--repeats", "0"]):
        with pytest.raises(SystemExit, match="--lengths must be at least 1024"):
            main(["bench", "prefill-speed", *bad])


def test_it_imports_without_the_langchain_stack_as_the_gpu_image_runs_it():
    code = ("import sys, agent_gravity.bench.prefill_speed; "
            "sys.exit(bool({'langchain_core', 'pydantic'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], timeout=300).returncode == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; the CPU twin above runs everywhere")
def test_on_a_gpu_the_block_sparse_arm_beats_dense_at_32k(tmp_path, capsys):
    report = _run(tmp_path, capsys, "--lengths", "32768", "--device", "cuda")
    assert report["rows"][0]["fixed"]["speedup"] > 1.0
