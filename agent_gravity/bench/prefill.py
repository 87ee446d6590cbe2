"""``agent-gravity bench prefill``: entropy-adaptive prefill against dense attention and fixed sparse patterns.

Every task's prompt is prefilled by each method on the transformers backend, one at a time, dense first. Per
method: prefill time (its ratio to dense on the same prompt), time to the first token, exact-value recall of the
greedy answer, and, teacher-forced along dense's answer, top-1 agreement and KL(dense || method) per position;
each with a 95% interval, overall and per context length. Baselines in the same run: every head on sinks plus a
local window (StreamingLLM's pattern, applied at prefill), and a DuoAttention-style fixed split (the heads that
looked most dynamic on a calibration prompt, never on a benchmarked one, stay dense everywhere; as many as
adaptive prefill kept dense there). The break-even length is where adaptive prefill stops being slower than dense.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agent_gravity.backends._adaptive_prefill import FixedPattern, PrefillReport, PrefillSpec, adaptive_prefill
from agent_gravity.backends.local_transformers import TransformersBackend
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench._stats import mean_ci, ratio_ci, wilson
from agent_gravity.bench.prefill_tasks import PrefillTask, generate_prefill_tasks

DENSE, ADAPTIVE, STREAMING, DUO = "dense", "adaptive", "streaming", "duo"
ANSWER_TOKENS = 8
GOAL = {"length": 8192, "speedup": 1.3, "agreement": 0.99, "recall_points": 0.01}


@dataclass
class Row:
    """One task under one method."""

    task: str
    kind: str
    tokens: int
    depth: float
    method: str
    prefill_s: float
    ttft_s: float
    answer: str
    recalled: bool
    agreement: float
    kl: float
    attention_share: float


def _spec(method: str, adaptive: PrefillSpec, duo: FixedPattern | None) -> PrefillSpec | None:
    if method == DENSE:
        return None
    if method == ADAPTIVE:
        return adaptive
    pattern = FixedPattern() if method == STREAMING else duo
    return PrefillSpec(min_tokens=adaptive.min_tokens, segment=adaptive.segment, block=adaptive.block,
                       window=adaptive.window, fixed=pattern)


def _prefill(backend: TransformersBackend, prompt: list[int],
             spec: PrefillSpec | None) -> tuple[Any, torch.Tensor, float, PrefillReport | None]:
    """The cache and last logits after ``prompt``, the prefill's seconds and what adaptive prefill did."""
    cache = backend.new_cache()
    start = time.perf_counter()
    if spec is None:
        return cache, backend.forward_rows(prompt, cache)[-1], time.perf_counter() - start, None
    with adaptive_prefill(spec) as report:
        logits = backend.forward_rows(prompt, cache)[-1]
    return cache, logits, time.perf_counter() - start, report


def _decode(backend: TransformersBackend, cache: Any, first: torch.Tensor, forced: list[int] | None,
            n: int) -> tuple[list[int], list[torch.Tensor]]:
    """``n`` answer tokens after a prefill, greedy or ``forced``, with the log-probabilities at each; the cache
    goes back to the end of the prompt."""
    rows, ids = [first.log_softmax(-1)], []
    for i in range(n):
        ids.append(forced[i] if forced is not None else int(rows[-1].argmax()))
        if i < n - 1:
            rows.append(backend.forward(ids[-1:], cache).log_softmax(-1))
    cache.crop(-(n - 1))
    return ids, rows


def run_task(backend: TransformersBackend, task: PrefillTask, methods: Sequence[str], adaptive: PrefillSpec,
             duo: FixedPattern | None) -> list[Row]:
    """Every method on one task, dense first: its greedy answer is what the others are forced along."""
    rows: list[Row] = []
    reference: tuple[list[int], list[torch.Tensor]] | None = None
    for method in methods:
        begun = time.perf_counter()
        prompt = backend.render(task.messages, task.prefix)
        cache, first, seconds, report = _prefill(backend, prompt, _spec(method, adaptive, duo))
        first_token = int(first.argmax())
        ttft = time.perf_counter() - begun
        answer, own = _decode(backend, cache, first, None, ANSWER_TOKENS)
        assert answer[0] == first_token
        reference = reference or (answer, own)
        forced, dense_rows = reference
        here = own if answer == forced else _decode(backend, cache, first, forced, ANSWER_TOKENS)[1]
        agreement = sum(int(m.argmax()) == t for m, t in zip(here, forced)) / ANSWER_TOKENS
        kl = sum(float((d.exp() * (d - m)).sum()) for d, m in zip(dense_rows, here)) / ANSWER_TOKENS
        text = backend.decode(answer)
        rows.append(Row(task.id, task.kind, task.tokens, task.depth, method, seconds, ttft, text,
                        task.value in text, agreement, max(kl, 0.0),
                        report.attention_share if report else 1.0))
    return rows


def calibrate_duo(backend: TransformersBackend, task: PrefillTask, adaptive: PrefillSpec) -> FixedPattern:
    """A fixed split from one calibration prompt: per layer, the heads adaptive prefill found most dynamic stay
    dense, as many over all layers as the (layer, segment, head) cells adaptive prefill kept dense there."""
    _, _, _, report = _prefill(backend, backend.render(task.messages, task.prefix), adaptive)
    assert report is not None
    scores = {(layer, h): v for layer, values in report.head_entropy.items() for h, v in enumerate(values)}
    chosen = sorted(scores, key=lambda key: scores[key], reverse=True)[:round((1 - report.sparse_share) * len(scores))]
    dense: dict[int, tuple[int, ...]] = {}
    for layer, h in sorted(chosen):
        dense[layer] = (*dense.get(layer, ()), h)
    return FixedPattern(dense_heads=dense)


def break_even(backend: TransformersBackend, lengths: Sequence[int], adaptive: PrefillSpec,
               rounds: int = 2) -> dict[str, Any]:
    """Dense against adaptive prefill time on a logs prompt at each length (best of ``rounds``, alternating);
    the break-even is the shortest length from which adaptive is never slower."""
    count = _counter(backend)
    spec = PrefillSpec(**{**asdict(adaptive), "min_tokens": 1, "fixed": None})
    ratios = {}
    for n in lengths:
        task = generate_prefill_tasks([n], count, depths=(0.5,), kinds=("logs",), seed=99)[0]
        prompt = backend.render(task.messages, task.prefix)
        times: dict[str, list[float]] = {DENSE: [], ADAPTIVE: []}
        for _ in range(rounds):
            for method, chosen in ((DENSE, None), (ADAPTIVE, spec)):
                times[method].append(_prefill(backend, prompt, chosen)[2])
        ratios[n] = min(times[DENSE]) / min(times[ADAPTIVE])
    faster = [n for n in lengths if all(ratios[m] >= 1.0 for m in lengths if m >= n)]
    return {"speedup": ratios, "break_even": min(faster) if faster else None}


def _counter(backend: TransformersBackend) -> Callable[[str], int]:
    return lambda text: len(backend.encode(text))


def summarize(rows: list[Row], methods: Sequence[str]) -> dict[str, Any]:
    """Per method, overall and per length: prefill ratio to dense, TTFT, recall, agreement and KL."""
    dense = {r.task: r for r in rows if r.method == DENSE}

    def block(chosen: list[Row]) -> dict[str, Any]:
        return {"prefill_speedup": ratio_ci([r.prefill_s for r in chosen], [dense[r.task].prefill_s for r in chosen]),
                "prefill_s": mean_ci([r.prefill_s for r in chosen]), "ttft_s": mean_ci([r.ttft_s for r in chosen]),
                "recall": wilson(sum(r.recalled for r in chosen), len(chosen)),
                "agreement": mean_ci([r.agreement for r in chosen]), "kl": mean_ci([r.kl for r in chosen]),
                "attention_share": mean_ci([r.attention_share for r in chosen]), "items": len(chosen)}

    out: dict[str, Any] = {}
    for method in methods:
        mine = [r for r in rows if r.method == method]
        out[method] = {"all": block(mine), "by_length": {
            n: block([r for r in mine if r.tokens == n]) for n in sorted({r.tokens for r in mine})},
            "by_kind": {k: block([r for r in mine if r.kind == k]) for k in sorted({r.kind for r in mine})}}
    return out


def _goal(methods: dict[str, Any]) -> dict[str, Any]:
    """The issue's CPU goal at its length (the longest measured when that is shorter)."""
    lengths = methods[ADAPTIVE]["by_length"]
    n = GOAL["length"] if GOAL["length"] in lengths else max(lengths)
    mine, dense = lengths[n], methods[DENSE]["by_length"][n]
    met = {"speedup": mine["prefill_speedup"]["value"] >= GOAL["speedup"],
           "agreement": mine["agreement"]["value"] >= GOAL["agreement"],
           "recall": mine["recall"]["value"] >= dense["recall"]["value"] - GOAL["recall_points"],
           "beats_fixed": all(mine["agreement"]["value"] >= methods[m]["by_length"][n]["agreement"]["value"]
                              for m in (STREAMING, DUO) if m in methods)}
    return {"length": n, **met, "met": all(met.values())}


def run(backend: TransformersBackend, lengths: Sequence[int], per_cell: int, adaptive: PrefillSpec,
        kinds: Sequence[str], break_even_lengths: Sequence[int],
        on_task: Callable[[PrefillTask], None] = lambda task: None) -> dict[str, Any]:
    """Calibrate the fixed split on a prompt of its own, run every task under every method, time break-even."""
    count = _counter(backend)
    tasks = generate_prefill_tasks(lengths, count, per_cell, kinds=kinds)
    calibration = generate_prefill_tasks([max(lengths)], count, depths=(0.5,), kinds=("logs",), seed=7)[0]
    duo = calibrate_duo(backend, calibration, adaptive)
    methods = (DENSE, ADAPTIVE, STREAMING, DUO)
    rows: list[Row] = []
    for task in tasks:
        rows += run_task(backend, task, methods, adaptive, duo)
        on_task(task)
    summary = summarize(rows, methods)
    return {"model": backend.model_name, "settings": {**asdict(adaptive), "lengths": list(lengths),
                                                       "per_cell": per_cell, "kinds": list(kinds),
                                                       "threads": torch.get_num_threads()},
            "duo_dense_heads": sum(len(h) for h in duo.dense_heads.values()),
            "methods": summary, "goal": _goal(summary),
            "break_even": break_even(backend, break_even_lengths, adaptive),
            "rows": [asdict(r) for r in rows]}


def table(report: dict[str, Any]) -> str:
    lines = [f"{'method':<10} {'tokens':>6} {'prefill x dense':>20} {'ttft s':>8} {'recall %':>20} "
             f"{'top-1 agree %':>20} {'KL':>8} {'attn share':>10}"]
    for method, m in report["methods"].items():
        for n, b in m["by_length"].items():
            lines.append(f"{method:<10} {n:>6} {interval(b['prefill_speedup'], digits=2):>20} "
                         f"{b['ttft_s']['value']:>8.2f} {interval(b['recall'], 100):>20} "
                         f"{interval(b['agreement'], 100):>20} {b['kl']['value']:>8.4f} "
                         f"{b['attention_share']['value']:>10.2f}")
    be = report["break_even"]
    lines.append("adaptive/dense prefill speed by length: " + ", ".join(
        f"{n}: {x:.2f}x" for n, x in be["speedup"].items()) + f"; break-even: {be['break_even']}")
    g = report["goal"]
    lines.append(f"goal at {g['length']} tokens: " + ", ".join(
        f"{k}: {'yes' if g[k] else 'NO'}" for k in ("speedup", "agreement", "recall", "beats_fixed")))
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Prefill speed against recall and top-1 agreement, by context length, per method."""
    with figure(path, f"prefill: {report['model']}", "", (11, 4.2), ncols=2) as axes:
        for method, m in report["methods"].items():
            lengths = list(m["by_length"])
            speed = [m["by_length"][n]["prefill_speedup"]["value"] for n in lengths]
            axes[0].plot(lengths, speed, marker="o", label=method)
            axes[1].plot(lengths, [100 * m["by_length"][n]["agreement"]["value"] for n in lengths], marker="o",
                         label=method)
        axes[0].set(xlabel="context tokens", ylabel="prefill speed vs dense (x)", xscale="log")
        axes[1].set(xlabel="context tokens", ylabel="top-1 agreement with dense (%)", xscale="log")
    return path


def main(backend: TransformersBackend, lengths: Sequence[int], per_cell: int, adaptive: PrefillSpec,
         kinds: Sequence[str], break_even_lengths: Sequence[int], out: Path,
         on_task: Callable[[PrefillTask], None] = lambda task: None) -> dict[str, Any]:
    report = run(backend, lengths, per_cell, adaptive, kinds, break_even_lengths, on_task)
    write_json(out / "prefill.json", report)
    plot(report, out / "prefill.png")
    return report
