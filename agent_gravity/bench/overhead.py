"""``agent-gravity bench overhead``: decode throughput with the gravity processor working, against the
same engine with it idle, measured alternately in one run.

Both arms run the same greedy prompts on the same engine. The gravity arm's requests carry the
default configuration's gravity and loop policies, so the processor computes every token's statistics
and steps every request's policies; the baseline's carry none, so the processor returns at once. The
gravity arm is marked structured, so its policies observe but never cut: both arms produce the very
same tokens and their throughputs compare directly. (Probes are separate requests, measured by
``bench savings`` instead.)
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent_gravity._config import GravityConfig
from agent_gravity._steering import SteeringSpec
from agent_gravity.backends.base import Backend, GenerationRequest, SamplingSettings, drain
from agent_gravity.bench._report import figure, spread, write_json

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "Describe a walk through a forest in autumn.",
    "List some facts about the moon.",
    "Explain why the sky is blue.",
    "Write a letter to a friend about a trip.",
    "Describe how bread is made.",
    "Tell me about the history of the telephone.",
)


@dataclass
class Round:
    batch: int
    mode: str
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _requests(backend: Backend, batch: int, tokens: int, gravity: bool) -> list[GenerationRequest]:
    out = []
    for i in range(batch):
        prompt = backend.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        config = GravityConfig()
        spec = SteeringSpec(key=uuid.uuid4().hex, eos_ids=tuple(backend.eos_ids), policy=config.policy,
                            loop=config.loop, structured=True) if gravity else None
        out.append(GenerationRequest(prompt, SamplingSettings(max_tokens=tokens), spec))
    return out


def run_round(backend: Backend, batch: int, tokens: int, gravity: bool) -> Round:
    requests = _requests(backend, batch, tokens, gravity)
    with ThreadPoolExecutor(max_workers=batch) as pool:
        start = time.perf_counter()
        results = list(pool.map(lambda r: drain(backend.stream(r)), requests))
        seconds = time.perf_counter() - start
    return Round(batch, "gravity" if gravity else "baseline", sum(len(r.token_ids) for r in results), seconds)


def run(backend: Backend, batches: list[int], rounds: int, tokens: int, on_round=lambda r: None) -> dict:
    """Alternate baseline and gravity rounds (ABBA order) and report the throughput ratio per batch size."""
    report: dict = {"backend": backend.provider, "model": backend.model_name, "tokens_per_request": tokens,
                    "batches": {}}
    for batch in batches:
        run_round(backend, batch, 8, True)  # warm-up, not counted
        ratios, pairs = [], []
        for i in range(rounds):
            order = (False, True) if i % 2 == 0 else (True, False)
            measured = {}
            for gravity in order:
                measured[gravity] = run_round(backend, batch, tokens, gravity)
                on_round(measured[gravity])
            if measured[True].tokens != measured[False].tokens:
                raise RuntimeError("the two arms generated different token counts; the comparison is void")
            ratios.append(measured[True].tokens_per_s / measured[False].tokens_per_s)
            pairs.append({m.mode: m.tokens_per_s for m in measured.values()})
        report["batches"][str(batch)] = {"ratio": spread(ratios), "rounds": pairs,
                                         "slowdown_median": 1 - spread(ratios)["median"]}
    return report


def table(report: dict) -> str:
    lines = [f"{'batch':>5} {'baseline tok/s':>15} {'gravity tok/s':>14} {'ratio (median)':>15} "
             f"{'IQR':>15} {'slowdown':>9}",
             "-" * 78]
    for batch, row in report["batches"].items():
        base = spread([p["baseline"] for p in row["rounds"]])["median"]
        grav = spread([p["gravity"] for p in row["rounds"]])["median"]
        r = row["ratio"]
        lines.append(f"{batch:>5} {base:>15.1f} {grav:>14.1f} {r['median']:>15.4f} "
                     f"{r['q1']:>7.4f}-{r['q3']:<7.4f} {row['slowdown_median'] * 100:>8.2f}%")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path:
    title = f"gravity processor overhead, {report['model']}"
    with figure(path, title, "throughput ratio (gravity / baseline)", (6, 3.5)) as ax:
        for batch, row in report["batches"].items():
            ratios = [p["gravity"] / p["baseline"] for p in row["rounds"]]
            ax.plot([int(batch)] * len(ratios), ratios, "o", alpha=0.6, label=f"batch {batch}")
        ax.axhline(1.0, color="grey", lw=1)
        ax.axhline(0.98, color="red", lw=1, ls="--", label="2% slower")
        ax.set_xlabel("batch size")
    return path


def main(backend: Backend, batches: list[int], rounds: int, tokens: int, out_dir: Path, progress) -> dict:
    report = run(backend, batches, rounds, tokens, on_round=progress)
    write_json(out_dir / "overhead.json", report)
    plot(report, out_dir / "overhead.png")
    return report
