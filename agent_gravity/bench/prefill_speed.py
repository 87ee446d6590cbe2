"""``agent-gravity bench prefill-speed``: the prepared GPU run of entropy-adaptive prefill, for speed only.

A random-weight model of a real architecture (Llama 3.2 1B's shapes, ``layers`` of its 16 decoder layers)
prefills synthetic token ids of each length, dense (torch's fused scaled-dot-product attention, flash on a GPU)
against the adaptive path: heads dense in every segment in one fused pass, the others in one block-sparse
kernel launch over their table of key blocks (Triton on a GPU). Random weights have no real head types, so two
adaptive arms run: the run-time estimate (it finds heads dynamic and keeps them dense: what the estimate and
planning cost), and a fixed split that makes ``sparse_share`` of each layer's heads sparse (sinks plus the local
window: what the block-sparse path saves at that density). Times are the best of ``repeats`` after a warm-up;
answers are not checked (``bench prefill`` does that on the embedded model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from agent_gravity.backends._adaptive_prefill import FixedPattern, PrefillReport, PrefillSpec, adaptive_prefill
from agent_gravity.backends._ragged_cache import ATTENTION as RAGGED
from agent_gravity.backends._ragged_cache import RaggedCache
from agent_gravity.backends._ragged_cache import active as ragged_cache_active
from agent_gravity.backends._ragged_cache import register as register_ragged_attention
from agent_gravity.backends._ragged_cache import unused_mask
from agent_gravity.bench._report import figure, write_json

LLAMA_3_2_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
                "head_dim": 64, "num_hidden_layers": 16, "vocab_size": 128256, "rope_theta": 500000.0,
                "max_position_embeddings": 131072, "tie_word_embeddings": True}
"""Llama 3.2 1B's published shapes (its config.json); the weights are random."""
GOAL = {"length": 65536, "speedup": 2.0}
ARMS = ("estimate", "fixed")


def random_model(layers: int, device: str, dtype: torch.dtype) -> Any:
    """Llama 3.2 1B's architecture with its first ``layers`` decoder layers and random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if not 1 <= layers <= LLAMA_3_2_1B["num_hidden_layers"]:
        raise ValueError(f"layers must be 1..{LLAMA_3_2_1B['num_hidden_layers']}, got {layers}")
    register_ragged_attention()
    config = LlamaConfig(**{**LLAMA_3_2_1B, "num_hidden_layers": layers})
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def _timed(run: Callable[[], object], device: str, repeats: int) -> float:
    """Best wall time of ``repeats`` runs after one warm-up, the device synchronised around each."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    for i in range(repeats + 1):
        sync()
        start = time.perf_counter()
        run()
        sync()
        if i:
            best = min(best, time.perf_counter() - start)
    return best


def _dense(model: Any, ids: torch.Tensor) -> Callable[[], object]:
    model.set_attn_implementation("sdpa")  # once, outside the timed runs

    def run() -> object:
        with torch.no_grad():
            return model(ids, use_cache=False, logits_to_keep=1)
    return run


def _adaptive(model: Any, ids: torch.Tensor, spec: PrefillSpec, report: list[PrefillReport]) -> Callable[[], object]:
    config = model.config
    model.set_attn_implementation(RAGGED)  # once, outside the timed runs

    def run() -> object:
        cache = RaggedCache(config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
        with torch.no_grad(), ragged_cache_active(cache), adaptive_prefill(spec) as done:
            out = model(ids, past_key_values=cache, attention_mask=unused_mask(ids.device), use_cache=True,
                        logits_to_keep=1)
        report[:] = [done]
        return out
    return run


def fixed_split(heads: int, layers: int, sparse_share: float) -> FixedPattern:
    """Each layer's first heads stay dense, the rest (``sparse_share`` of them) attend over sinks and window."""
    dense = tuple(range(round(heads * (1 - sparse_share))))
    return FixedPattern({layer: dense for layer in range(layers)})


def run(lengths: Sequence[int], layers: int, sparse_share: float, repeats: int, device: str,
        on_length: Callable[[int], None] = lambda _: None) -> dict[str, Any]:
    """Every length: dense and both adaptive arms, one prompt each."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = random_model(layers, device, dtype)
    heads = model.config.num_attention_heads
    specs = {"estimate": PrefillSpec(min_tokens=1),
             "fixed": PrefillSpec(min_tokens=1, fixed=fixed_split(heads, layers, sparse_share))}
    rows = []
    for n in lengths:
        on_length(n)
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n)).to(device)
        dense = _timed(_dense(model, ids), device, repeats)
        row: dict[str, Any] = {"tokens": n, "dense_s": dense}
        for arm, spec in specs.items():
            report: list[PrefillReport] = []
            seconds = _timed(_adaptive(model, ids, spec, report), device, repeats)
            row[arm] = {"seconds": seconds, "speedup": dense / seconds,
                        "attention_share": report[0].attention_share, "sparse_share": report[0].sparse_share}
        rows.append(row)
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    reached = [r for r in rows if r["tokens"] >= GOAL["length"]]
    return {"rows": rows, "goal": {"checked": bool(reached), "met": bool(reached) and all(
        r["fixed"]["speedup"] >= GOAL["speedup"] for r in reached)},
            "settings": {"architecture": "Llama 3.2 1B shapes, random weights", "layers": layers,
                         "sparse_share": sparse_share, "repeats": repeats, "device": _device_name(device),
                         "dtype": str(dtype).removeprefix("torch.")}}


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else device


def table(report: dict[str, Any]) -> str:
    """One row per length: dense time and each arm's time, speedup and attention share."""
    head = f"{'tokens':>8} {'dense s':>9} " + " ".join(f"{a + ' s':>11} {'x':>6} {'attn':>6}" for a in ARMS)
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(f"{r['tokens']:>8} {r['dense_s']:>9.3f} " + " ".join(
            f"{r[a]['seconds']:>11.3f} {r[a]['speedup']:>6.2f} {r[a]['attention_share']:>6.2f}" for a in ARMS))
    s, goal = report["settings"], report["goal"]
    lines.append(f"{s['architecture']}, {s['layers']} layers, {s['dtype']} on {s['device']}; fixed split: "
                 f"{s['sparse_share']:.0%} of heads sparse. Speed only: answers are not checked.")
    lines.append(f"goal (fixed split >= {GOAL['speedup']}x at {GOAL['length']} tokens or more): "
                 + ("met" if goal["met"] else "NOT met" if goal["checked"] else "no length reached it"))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Speedup over dense against context length, one line per arm."""
    with figure(path, "bench prefill-speed: adaptive prefill against dense attention", "x dense speed",
                (6, 4)) as ax:
        for arm in ARMS:
            ax.plot([r["tokens"] for r in report["rows"]], [r[arm]["speedup"] for r in report["rows"]], marker="o",
                    label=arm)
        ax.axhline(1.0, color="grey", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
    return path


def main(lengths: Sequence[int], layers: int, sparse_share: float, repeats: int, device: str, out_dir: Path,
         on_length: Callable[[int], None]) -> dict[str, Any]:
    """Run the benchmark and write ``prefill_speed.json`` and ``prefill_speed.png`` under ``out_dir``."""
    report = run(lengths, layers, sparse_share, repeats, device, on_length)
    write_json(out_dir / "prefill_speed.json", report)
    plot(report, out_dir / "prefill_speed.png")
    return report
