"""``agent-gravity bench kernels``: token_entropy against torch eager and torch.compile, per shape.

Time is the median of CUDA-event (or wall-clock, on the CPU) timings; GB/s counts one read of the
logits, the least any implementation must move. On a GPU the fraction of the copy bandwidth
measured in the same run is reported too. The Triton kernel needs CUDA: on the CPU only the two
torch variants run, and the report says so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from agent_gravity.bench._report import figure, write_json
from agent_gravity.kernels import TokenStats, token_entropy, token_entropy_reference

SHAPES = ((1, 49_152), (8, 49_152), (1, 152_064), (8, 152_064), (64, 152_064), (256, 152_064), (8, 256_000))


def _time(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def copy_bandwidth(device: torch.device, repeats: int) -> float | None:
    """Device-to-device copy bandwidth in GB/s (bytes read plus written), or None off the GPU."""
    if device.type != "cuda":
        return None
    src = torch.randn(1 << 28, device=device)  # 1 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _time(lambda: dst.copy_(src), device, repeats) / 1e9


def run(device: torch.device, dtype: torch.dtype, repeats: int, shapes=SHAPES) -> dict:
    compiled = torch.compile(token_entropy_reference)
    peak = copy_bandwidth(device, repeats)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "dtype": str(dtype).removeprefix("torch."), "copy_gb_s": peak, "rows": []}
    for rows, vocab in shapes:
        logits = torch.randn(rows, vocab, device=device, dtype=dtype) * 4
        out = TokenStats.empty(rows, device)
        variants = {"torch eager": lambda: token_entropy_reference(logits, out=out),
                    "torch.compile": lambda: compiled(logits, out=out)}
        if device.type == "cuda":
            variants["triton (ours)"] = lambda: token_entropy(logits, out=out, impl="triton")
        nbytes = logits.numel() * logits.element_size()
        for name, fn in variants.items():
            seconds = _time(fn, device, repeats)
            gb_s = nbytes / seconds / 1e9
            report["rows"].append({"rows": rows, "vocab": vocab, "impl": name, "us": seconds * 1e6, "gb_s": gb_s,
                                   "of_copy": gb_s / peak if peak else None})
    return report


def table(report: dict) -> str:
    head = f"{'rows':>5} {'vocab':>8} {'impl':<14} {'time us':>10} {'GB/s':>9} {'of copy bw':>10}"
    lines = [f"device {report['device']}, {report['dtype']}, copy bandwidth "
             f"{report['copy_gb_s']:.0f} GB/s" if report["copy_gb_s"] else
             f"device {report['device']}, {report['dtype']} (no GPU: the Triton kernel is not timed)", head,
             "-" * len(head)]
    for r in report["rows"]:
        share = f"{r['of_copy'] * 100:.0f}%" if r["of_copy"] else "-"
        lines.append(f"{r['rows']:>5} {r['vocab']:>8} {r['impl']:<14} {r['us']:>10.1f} {r['gb_s']:>9.1f} {share:>10}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path:
    impls = sorted({r["impl"] for r in report["rows"]})
    shapes = sorted({(r["rows"], r["vocab"]) for r in report["rows"]}, key=lambda s: (s[1], s[0]))
    width = 0.8 / len(impls)
    title = f"token_entropy on {report['device']} ({report['dtype']})"
    with figure(path, title, "GB/s (one read of the logits)", (7, 3.8)) as ax:
        for i, impl in enumerate(impls):
            values = {(r["rows"], r["vocab"]): r["gb_s"] for r in report["rows"] if r["impl"] == impl}
            ax.bar([x + i * width for x in range(len(shapes))], [values.get(s, 0) for s in shapes], width,
                   label=impl)
        if report["copy_gb_s"]:
            ax.axhline(report["copy_gb_s"], color="grey", ls="--", lw=1, label="copy bandwidth")
        ax.set_xticks([x + width * (len(impls) - 1) / 2 for x in range(len(shapes))],
                      [f"{r}x{v // 1000}k" for r, v in shapes], fontsize=7)
    return path


def main(device: str, dtype: str, repeats: int, out_dir: Path) -> dict:
    torch_device = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    report = run(torch_device, getattr(torch, dtype), repeats)
    write_json(out_dir / "kernels.json", report)
    plot(report, out_dir / "kernels.png")
    return report
