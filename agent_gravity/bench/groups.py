"""``agent-gravity bench groups``: compute groups against the full group, in one run, on the transformers backend.

Each group is a ComputeConfig (None: the full group, A). Every group answers every item, in an order that
rotates per item, so drift in the machine's speed falls on all groups alike. Two task sets: the savings set
(reasoning with the default gravity) and long structured outputs (where gravity zones are long). Per group:
time to first token, end-to-end time, decode tokens/s, output tokens, accuracy, answers identical to group
A's, drafts kept, and forward passes saved; each as a ratio to group A over the same items with a paired
bootstrap 95% interval. Items on which a group never drafted show what its zone test costs elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import ComputeConfig, GravityConfig
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench._stats import ratio_ci, wilson
from agent_gravity.bench.structured_tasks import StructuredTask, generate_structured_tasks
from agent_gravity.bench.tasks import Task, is_correct, load_tasks

FULL = "full"
GROUPS: dict[str, ComputeConfig | None] = {FULL: None, "lossless": ComputeConfig()}
"""Group A and the groups built so far; each runs with the same gravity settings."""
STRUCTURED_GRAVITY = GravityConfig(enabled=False, reasoning=None, max_answer_tokens=320)
"""Long structured outputs are answered directly, with no exit: the groups differ only in compute."""


@dataclass(frozen=True)
class Item:
    """One question of a task set, with how to judge its answer."""

    id: str
    kind: str
    question: str
    correct: Callable[[str], bool]


@dataclass
class Run:
    """One group's answer to one item, and what it cost."""

    item: str
    group: str
    first_token_s: float
    total_s: float
    output_tokens: int
    text: str
    correct: bool
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    entropy: list[float] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.first_token_s, 1e-9)


def savings_items(n: int) -> list[Item]:
    """The first ``n`` reasoning items of the shipped savings set."""
    tasks: list[Task] = [t for t in load_tasks() if t.answer is not None][:n]
    return [Item(t.id, t.kind, t.question, lambda text, t=t: is_correct(t, text)) for t in tasks]


def structured_items(per_kind: int, seed: int = 0) -> list[Item]:
    tasks: list[StructuredTask] = generate_structured_tasks(per_kind, seed)
    return [Item(t.id, t.kind, t.question, t.correct) for t in tasks]


def answer(model: ChatGravity, item: Item, group: str) -> Run:
    """Stream one answer, timing its first token (reasoning or answer) and its end."""
    start = time.perf_counter()
    first, message = None, None
    for chunk in model.stream([HumanMessage(item.question)]):
        if first is None and (chunk.content or chunk.additional_kwargs.get("reasoning_content")):
            first = time.perf_counter() - start
        message = chunk if message is None else message + chunk
    total = time.perf_counter() - start
    gravity = message.response_metadata["gravity"]
    drafts = (gravity.get("compute") or {}).get("speculation") or {}
    text = f"{message.additional_kwargs.get('reasoning_content', '')}\n{message.content}"
    return Run(item.id, group, total if first is None else first, total, message.usage_metadata["output_tokens"],
               text, item.correct(message.content), drafts.get("drafted", 0), drafts.get("accepted", 0),
               drafts.get("passes", 0), list(gravity["entropy"]), list(drafts.get("accepted_at", [])))


def run_set(backend: Any, items: Sequence[Item], groups: Sequence[str], gravity: GravityConfig,
            advance: Callable[[str], None]) -> list[Run]:
    """Every group answers every item (the order of groups rotates per item) after one warm-up answer each."""
    models = {g: ChatGravity(backend=backend, gravity=gravity, compute=GROUPS[g]) for g in groups}
    for g in groups:
        answer(models[g], items[0], g)
    runs = []
    for i, item in enumerate(items):
        for g in [*groups[i % len(groups):], *groups[:i % len(groups)]]:
            runs.append(answer(models[g], item, g))
        advance(f"{item.id} ({i + 1}/{len(items)})")
    return runs


def summarize(runs: Sequence[Run], groups: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per group, its figures and its ratios to the full group over the same items."""
    by = {g: sorted((r for r in runs if r.group == g), key=lambda r: r.item) for g in groups}
    full = by[FULL]
    out = {}
    for g, rs in by.items():
        idle = [i for i, r in enumerate(rs) if r.drafted == 0]
        tokens = sum(r.output_tokens for r in rs)
        out[g] = {
            "items": len(rs), "output_tokens": tokens,
            "decode_tokens_per_s": tokens / sum(r.decode_s for r in rs),
            "accuracy": wilson(sum(r.correct for r in rs), len(rs)),
            "identical_to_full": wilson(sum(r.text == f.text for r, f in zip(rs, full)), len(rs)),
            "first_token_ratio": ratio_ci([f.first_token_s for f in full], [r.first_token_s for r in rs]),
            "total_ratio": ratio_ci([f.total_s for f in full], [r.total_s for r in rs]),
            "decode_speedup": ratio_ci([r.decode_s for r in rs], [f.decode_s for f in full]),
            "drafted": sum(r.drafted for r in rs), "accepted": sum(r.accepted for r in rs),
            "acceptance": sum(r.accepted for r in rs) / max(1, sum(r.drafted for r in rs)),
            "passes_saved": sum(r.accepted for r in rs) / max(1, tokens),
            "never_drafted": {"items": len(idle), "total_ratio": ratio_ci([full[i].total_s for i in idle],
                                                                          [rs[i].total_s for i in idle])},
        }
    return out


def run(backend: Any, sets: dict[str, tuple[Sequence[Item], GravityConfig]], groups: Sequence[str],
        advance: Callable[[str], None]) -> dict[str, Any]:
    unknown = set(groups) - set(GROUPS)
    if unknown or FULL not in groups:
        raise ValueError(f"groups must include {FULL!r} and come from {sorted(GROUPS)}; got {sorted(groups)}")
    report: dict[str, Any] = {"groups": list(groups), "sets": {}, "runs": {}}
    for name, (items, gravity) in sets.items():
        runs = run_set(backend, items, groups, gravity, lambda s, name=name: advance(f"{name}: {s}"))
        report["sets"][name] = summarize(runs, groups)
        report["runs"][name] = [asdict(r) for r in runs]
    return report


def table(report: dict[str, Any]) -> str:
    """One row per task set and group: ratios to the full group with 95% intervals."""
    head = (f"{'set':<11} {'group':<9} {'items':>5} {'decode speedup':>20} {'time / full':>20} {'1st token / full':>20} "
            f"{'tok/s':>7} {'identical %':>20} {'accuracy %':>20} {'kept/drafted':>13} {'idle items: time / full':>26}")
    lines = [head, "-" * len(head)]
    for name, groups in report["sets"].items():
        for g, s in groups.items():
            idle = s["never_drafted"]
            lines.append(
                f"{name:<11} {g:<9} {s['items']:>5} {interval(s['decode_speedup'], 1, 2):>20} "
                f"{interval(s['total_ratio'], 1, 2):>20} {interval(s['first_token_ratio'], 1, 2):>20} "
                f"{s['decode_tokens_per_s']:>7.1f} {interval(s['identical_to_full'], 100):>20} "
                f"{interval(s['accuracy'], 100):>20} {s['accepted']:>6}/{s['drafted']:<6} "
                f"{idle['items']:>4}: {interval(idle['total_ratio'], 1, 3):>20}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> Path:
    """Decode speedup per group and set; the entropy curve of one structured answer with the drafted tokens kept."""
    with figure(path, "bench groups: compute inside gravity zones", "", (11, 4.2), ncols=2) as (left, right):
        names = list(report["sets"])
        for k, g in enumerate(report["groups"]):
            s = [report["sets"][n][g]["decode_speedup"] for n in names]
            left.errorbar([i + 0.15 * k for i in range(len(names))], [x["value"] for x in s],
                          yerr=[[x["value"] - x["lo"] for x in s], [x["hi"] - x["value"] for x in s]],
                          fmt="o", capsize=3, label=g)
        left.set_xticks(range(len(names)), names)
        left.set_ylabel("decode speedup over full (x)")
        left.axhline(1.0, color="grey", lw=0.8)
        runs = report["runs"].get("structured") or next(iter(report["runs"].values()))
        sample = next((r for r in runs if r["accepted"]), runs[0])
        right.plot(sample["entropy"], color="black", lw=0.8, label=f"entropy ({sample['item']}, {sample['group']})")
        kept = sample["accepted_at"]
        right.scatter(kept, [sample["entropy"][i] for i in kept if i < len(sample["entropy"])][:len(kept)],
                      s=8, color="tab:green", label="drafted token kept", zorder=3)
        right.set_xlabel("output token")
        right.set_ylabel("next-token entropy (nats)")
    return path


def main(backend: Any, savings: int, per_kind: int, groups: Sequence[str], out_dir: Path,
         advance: Callable[[str], None]) -> dict[str, Any]:
    """Run the benchmark and write ``groups.json`` and ``groups.png`` under ``out_dir``."""
    sets: dict[str, tuple[Sequence[Item], GravityConfig]] = {}
    if savings:
        sets["savings"] = (savings_items(savings), GravityConfig())
    if per_kind:
        sets["structured"] = (structured_items(per_kind), STRUCTURED_GRAVITY)
    if not sets:
        raise ValueError("nothing to run: give --items or --per-kind above 0")
    report = run(backend, sets, groups, advance)
    write_json(out_dir / "groups.json", report)
    plot(report, out_dir / "groups.png")
    return report
