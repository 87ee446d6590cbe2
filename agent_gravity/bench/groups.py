"""``agent-gravity bench groups``: compute groups against the full group, in one run, on the transformers backend.

The concept's four groups (A full, B KV quantization after the lock, C layer skipping after the lock, D both),
the lossless group (drafts checked in one pass), a 4-bit KV group, a lighter skip for the speed/answers frontier,
and top-2 sampling (on the savings items at temperature 0.7, against full sampling at the same seeds). Each group
is a ComputeConfig. Every group answers every item, in an order that rotates per item, so drift in the machine's
speed falls on all groups alike. Two task sets at temperature 0: the savings set (reasoning with the default
gravity) and long structured outputs (where gravity zones are long). Per group: time to first token, end-to-end
time, decode tokens/s, output tokens, KV bytes at the end, peak process memory, accuracy, answers kept and
outputs identical to group A's, teacher-forced top-1 agreement of the packed cache with the full one, drafts
kept and layer passes saved; ratios to group A over the same items with paired bootstrap 95% intervals.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from agent_gravity._chat_model import ChatGravity
from agent_gravity._config import (
    ComputeConfig,
    GravityConfig,
    LayerSkipConfig,
    SpeculationConfig,
    Top2Config,
    ZoneKVConfig,
)
from agent_gravity._profile import load_profile
from agent_gravity.backends._layer_skip import middle_layers
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench._stats import ratio_ci, wilson
from agent_gravity.bench.structured_tasks import StructuredTask, generate_structured_tasks
from agent_gravity.bench.tasks import Task, agrees, is_correct, load_tasks

FULL = "full"
NEVER = 1e-3
"""The zone threshold of the never-zone group (nats): no stretch of an answer is that certain, so the lossless
settings run without ever acting, and their time against group A is what a request outside zones pays."""


@dataclass(frozen=True)
class Layers:
    """The layers the layer groups do without: those ``agent-gravity calibrate --layers`` chose for the model where
    its profile has them, else the middle quarter (``source`` says which, per use)."""

    draft: tuple[int, ...]
    skip: tuple[int, ...]
    source: dict[str, str]

    @classmethod
    def of(cls, backend: Any) -> Layers:
        profile = load_profile(backend.model_name)
        found = profile.layers if profile is not None else None
        middle, chosen, source = middle_layers(backend.num_layers, 0.25), {}, {}
        for use in ("draft", "skip"):
            layers = getattr(found, f"{use}_layers") if found is not None else None
            chosen[use] = layers or middle
            source[use] = ("calibrated" if layers else "middle quarter (calibration chose none)" if found is not None
                           else "middle quarter (not calibrated: agent-gravity calibrate --layers)")
        return cls(chosen["draft"], chosen["skip"], source)


_OFF = {"speculate": None}
GROUPS: dict[str, Callable[[Layers], ComputeConfig]] = {
    FULL: lambda ly: ComputeConfig(**_OFF),  # A: no action
    "lossless": lambda ly: ComputeConfig(),
    "lossless+layers": lambda ly: ComputeConfig(speculate=SpeculationConfig(layers=ly.draft)),
    "never-zone": lambda ly: ComputeConfig(below=NEVER),
    "kv8": lambda ly: ComputeConfig(**_OFF, kv=ZoneKVConfig(bits=8)),  # B
    "kv4": lambda ly: ComputeConfig(**_OFF, kv=ZoneKVConfig(bits=4)),
    "skip": lambda ly: ComputeConfig(**_OFF, skip=LayerSkipConfig(layers=ly.skip)),  # C
    "skip+kv8": lambda ly: ComputeConfig(**_OFF, kv=ZoneKVConfig(bits=8), skip=LayerSkipConfig(layers=ly.skip)),  # D
    "skip10": lambda ly: ComputeConfig(**_OFF, skip=LayerSkipConfig(fraction=0.1)),
    "top2": lambda ly: ComputeConfig(**_OFF, top2=Top2Config()),
}
"""Every group, by name, for a model's ``Layers``; group A runs the same decode loop with no action, so its KV
bytes are reported too."""
SAMPLED = {"top2"}
"""Groups that change nothing at temperature 0: they run on the sampled set only."""
SAMPLING_TEMPERATURE = 0.7
STRUCTURED_GRAVITY = GravityConfig(enabled=False, reasoning=None, max_answer_tokens=320)
"""Long structured outputs are answered directly, with no exit: the groups differ only in compute."""


@dataclass(frozen=True)
class Item:
    """One question of a task set, with how to judge its answer."""

    id: str
    kind: str
    question: str
    correct: Callable[[str], bool]
    same: Callable[[str, str], bool] = str.__eq__
    """Whether two answers to it are the same answer."""


@dataclass
class Run:
    """One group's answer to one item, and what it cost and did."""

    item: str
    group: str
    first_token_s: float
    total_s: float
    output_tokens: int
    text: str
    correct: bool
    answer: str = ""
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    entropy: list[float] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    kv_bytes: int = 0
    zone_entries: int = 0
    zone_bytes_held: int = 0
    zone_bytes_full: int = 0
    packed_at: list[int] = field(default_factory=list)
    skip_steps: int = 0
    layer_passes_saved: int = 0
    skipped_at: list[int] = field(default_factory=list)
    top2_steps: int = 0
    top2_at: list[int] = field(default_factory=list)
    peak_rss_mib: float | None = None
    forced_same: int = 0
    """Teacher-forced along group A's output: positions where this group's cache picks group A's top-1 token."""
    forced: int = 0

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.first_token_s, 1e-9)

    @property
    def acted(self) -> bool:
        return bool(self.drafted or self.zone_entries or self.skip_steps or self.top2_steps)


def savings_items(n: int) -> list[Item]:
    """The first ``n`` reasoning items of the shipped savings set."""
    tasks: list[Task] = [t for t in load_tasks() if t.answer is not None][:n]
    return [Item(t.id, t.kind, t.question, lambda text, t=t: is_correct(t, text),
                 lambda a, b, t=t: agrees(t, a, b)) for t in tasks]


def structured_items(per_kind: int, seed: int = 0) -> list[Item]:
    tasks: list[StructuredTask] = generate_structured_tasks(per_kind, seed)
    return [Item(t.id, t.kind, t.question, t.correct) for t in tasks]


def _peak_rss_reset() -> bool:
    """Reset this process's peak resident memory (Linux); False where it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_mib() -> float | None:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) / 1024 if match else None


def answer(model: ChatGravity, item: Item, group: str, seed: int | None = None) -> Run:
    """Stream one answer, timing its first token (reasoning or answer) and its end, with the process's peak memory
    over it."""
    measured = _peak_rss_reset()
    start = time.perf_counter()
    first, message = None, None
    for chunk in model.stream([HumanMessage(item.question)], seed=seed):
        if first is None and (chunk.content or chunk.additional_kwargs.get("reasoning_content")):
            first = time.perf_counter() - start
        message = chunk if message is None else message + chunk
    total = time.perf_counter() - start
    gravity = message.response_metadata["gravity"]
    compute = gravity.get("compute") or {}
    drafts, kv = compute.get("speculation") or {}, compute.get("kv") or {}
    skip, top2 = compute.get("skip") or {}, compute.get("top2") or {}
    text = f"{message.additional_kwargs.get('reasoning_content', '')}\n{message.content}"
    return Run(item.id, group, total if first is None else first, total, message.usage_metadata["output_tokens"],
               text, item.correct(message.content), answer=message.content, drafted=drafts.get("drafted", 0),
               accepted=drafts.get("accepted", 0), passes=drafts.get("passes", 0), entropy=list(gravity["entropy"]),
               accepted_at=list(drafts.get("accepted_at", [])), kv_bytes=compute.get("kv_bytes", 0),
               zone_entries=kv.get("entries", 0), zone_bytes_held=kv.get("bytes_held", 0),
               zone_bytes_full=kv.get("bytes_full", 0), packed_at=list(kv.get("at", [])),
               skip_steps=skip.get("steps", 0), layer_passes_saved=skip.get("layer_passes_saved", 0),
               skipped_at=list(skip.get("skipped_at", [])), top2_steps=top2.get("steps", 0),
               top2_at=list(top2.get("at", [])), peak_rss_mib=_peak_rss_mib() if measured else None)


def teacher_forced(backend: Any, model: ChatGravity, item: Item, full: Run, run: Run,
                   plain: dict[str, list[int]]) -> None:
    """Fill ``run``'s agreement: along group A's output (its text re-encoded), the top-1 tokens of ``run``'s group's
    packed cache against the full-precision cache's (computed once per item, kept in ``plain``)."""
    call = model._prepare([HumanMessage(item.question)], None, {})
    compute = call.request.compute
    if compute is None or compute.kv is None or compute.skip is not None:  # a skipping group's network differs
        return
    forced = backend.encode(_raw(full, call.fmt))
    if item.id not in plain:
        plain[item.id] = backend.top1_along(call.request.prompt_ids, forced)
    packed = backend.top1_along(call.request.prompt_ids, forced, compute)
    run.forced_same, run.forced = sum(a == b for a, b in zip(packed, plain[item.id])), len(plain[item.id])


def _raw(run: Run, fmt: Any) -> str:
    """The output text as the model wrote it: reasoning, the end marker and answer prefix, the answer."""
    if fmt is None:
        return run.answer
    reasoning = run.text[:len(run.text) - len(run.answer) - 1]
    return f"{reasoning}{fmt.end}{fmt.answer_prefix} {run.answer}"


def run_set(backend: Any, items: Sequence[Item], groups: Sequence[str], gravity: GravityConfig,
            advance: Callable[[str], None], temperature: float = 0.0, layers: Layers | None = None) -> list[Run]:
    """Every group answers every item (the order of groups rotates per item) after one warm-up answer each."""
    layers = layers or Layers.of(backend)
    models = {g: ChatGravity(backend=backend, gravity=gravity, compute=GROUPS[g](layers),
                             temperature=temperature) for g in groups}
    for g in groups:
        answer(models[g], items[0], g, seed=0)
    runs: list[Run] = []
    plain: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        mine = {g: answer(models[g], item, g, seed=i) for g in [*groups[i % len(groups):], *groups[:i % len(groups)]]}
        for g, r in mine.items():
            teacher_forced(backend, models[g], item, mine[FULL], r, plain)
        runs.extend(mine[g] for g in groups)
        advance(f"{item.id} ({i + 1}/{len(items)})")
    return runs


def summarize(runs: Sequence[Run], groups: Sequence[str], layers: int,
              items: Sequence[Item] = ()) -> dict[str, dict[str, Any]]:
    """Per group, its figures and its ratios to the full group over the same items (``layers``: the model's)."""
    by = {g: sorted((r for r in runs if r.group == g), key=lambda r: r.item) for g in groups}
    same = {i.id: i.same for i in items}
    full = by[FULL]
    out = {}
    for g, rs in by.items():
        idle = [i for i, r in enumerate(rs) if not r.acted]
        tokens = sum(r.output_tokens for r in rs)
        kept = [same.get(r.item, str.__eq__)(f.answer, r.answer) for r, f in zip(rs, full)]
        rss = [(f.peak_rss_mib, r.peak_rss_mib) for r, f in zip(rs, full) if r.peak_rss_mib and f.peak_rss_mib]
        out[g] = {
            "items": len(rs), "output_tokens": tokens,
            "decode_tokens_per_s": tokens / sum(r.decode_s for r in rs),
            "accuracy": wilson(sum(r.correct for r in rs), len(rs)),
            "identical_to_full": wilson(sum(r.text == f.text for r, f in zip(rs, full)), len(rs)),
            "answers_kept": wilson(sum(kept), len(rs)),
            "first_token_ratio": ratio_ci([f.first_token_s for f in full], [r.first_token_s for r in rs]),
            "total_ratio": ratio_ci([f.total_s for f in full], [r.total_s for r in rs]),
            "decode_speedup": ratio_ci([r.decode_s for r in rs], [f.decode_s for f in full]),
            "kv_bytes_fewer": ratio_ci([r.kv_bytes for r in rs], [f.kv_bytes for f in full]),
            "zone_bytes_fewer": (sum(r.zone_bytes_full for r in rs) / sum(r.zone_bytes_held for r in rs)
                                 if any(r.zone_bytes_held for r in rs) else None),
            "zone_entries": sum(r.zone_entries for r in rs),
            "peak_rss_ratio": ratio_ci([a for a, _ in rss], [b for _, b in rss]),
            "teacher_forced_top1": wilson(sum(r.forced_same for r in rs), sum(r.forced for r in rs)),
            "drafted": sum(r.drafted for r in rs), "accepted": sum(r.accepted for r in rs),
            "acceptance": sum(r.accepted for r in rs) / max(1, sum(r.drafted for r in rs)),
            "passes_saved": sum(r.accepted for r in rs) / max(1, tokens),
            "layer_passes_saved": sum(r.layer_passes_saved for r in rs) / max(1, tokens * layers),
            "top2_steps": sum(r.top2_steps for r in rs),
            "idle": {"items": len(idle), "total_ratio": ratio_ci([full[i].total_s for i in idle],
                                                                 [rs[i].total_s for i in idle])},
        }
    return out


def run(backend: Any, sets: dict[str, tuple[Sequence[Item], GravityConfig, float]], groups: Sequence[str],
        advance: Callable[[str], None]) -> dict[str, Any]:
    """Run each set (items, gravity, temperature) with the groups that act at its temperature."""
    unknown = set(groups) - set(GROUPS)
    if unknown or FULL not in groups:
        raise ValueError(f"groups must include {FULL!r} and come from {sorted(GROUPS)}; got {sorted(groups)}")
    layers, chosen_layers = backend.num_layers, Layers.of(backend)
    report: dict[str, Any] = {"groups": list(groups), "layers": layers, "layers_used": asdict(chosen_layers),
                              "sets": {}, "runs": {}}
    for name, (items, gravity, temperature) in sets.items():
        chosen = [g for g in groups if (g in SAMPLED) == (temperature > 0) or g == FULL]
        if len(chosen) < 2:
            continue
        runs = run_set(backend, items, chosen, gravity, lambda s, name=name: advance(f"{name}: {s}"), temperature,
                       chosen_layers)
        report["sets"][name] = summarize(runs, chosen, layers, items)
        report["runs"][name] = [asdict(r) for r in runs]
    return report


def table(report: dict[str, Any]) -> str:
    """One row per task set and group: ratios to the full group with 95% intervals."""
    head = (f"{'set':<10} {'group':<9} {'items':>5} {'decode speedup':>18} {'time / full':>18} {'identical %':>18} "
            f"{'answers kept %':>18} {'accuracy %':>18} {'KV bytes: x fewer':>18} {'zone x':>6} "
            f"{'forced top-1 %':>18} {'layers saved %':>14} {'kept/drafted':>13} {'idle: time / full':>22}")
    lines = [head, "-" * len(head)]
    for name, groups in report["sets"].items():
        for g, s in groups.items():
            idle, zone = s["idle"], s["zone_bytes_fewer"]
            lines.append(
                f"{name:<10} {g:<9} {s['items']:>5} {interval(s['decode_speedup'], 1, 2):>18} "
                f"{interval(s['total_ratio'], 1, 2):>18} {interval(s['identical_to_full'], 100):>18} "
                f"{interval(s['answers_kept'], 100):>18} {interval(s['accuracy'], 100):>18} "
                f"{interval(s['kv_bytes_fewer'], 1, 2):>18} {'-' if zone is None else f'{zone:.2f}':>6} "
                f"{interval(s['teacher_forced_top1'], 100) if s['teacher_forced_top1']['n'] else '-':>18} "
                f"{100 * s['layer_passes_saved']:>14.1f} {s['accepted']:>6}/{s['drafted']:<6} "
                f"{idle['items']:>4}: {interval(idle['total_ratio'], 1, 3):>16}")
    return "\n".join(lines)


_ACTIONS = (("lossless", "accepted_at", "drafted token kept"), ("kv8", "packed_at", "KV entry packed (8 bits)"),
            ("skip", "skipped_at", "layers skipped"), ("top2", "top2_at", "top-2 sample"))


def plot(report: dict[str, Any], path: Path) -> Path:
    """Decode speedup against answers kept per group and set (the frontier); the entropy curve of one answer with
    where each group acted on it."""
    with figure(path, "bench groups: compute inside gravity zones", "", (12, 4.4), ncols=2) as (left, right):
        for k, (name, groups) in enumerate(report["sets"].items()):
            for g, s in groups.items():
                left.scatter(s["decode_speedup"]["value"], 100 * s["answers_kept"]["value"],
                             marker="os^"[k % 3], s=30, label=f"{g} ({name})")
        left.set_xlabel("decode speedup over full (x)")
        left.set_ylabel("answers kept against full (%)")
        left.axvline(1.0, color="grey", lw=0.8)
        name = "structured" if "structured" in report["runs"] else next(iter(report["runs"]))
        runs = report["runs"][name]
        item = next((r["item"] for r in runs if r["group"] != FULL and r["accepted"] + r["skip_steps"]), runs[0]["item"])
        mine = {r["group"]: r for r in runs if r["item"] == item}
        right.plot(mine[FULL]["entropy"], color="black", lw=0.8, label=f"entropy ({item}, full)")
        for k, (group, key, label) in enumerate(_ACTIONS):
            if group in mine and mine[group][key]:
                right.scatter(mine[group][key], [-0.25 * (k + 1)] * len(mine[group][key]), s=6, marker="|",
                              label=f"{group}: {label}")
        right.set_xlabel("output token")
        right.set_ylabel("next-token entropy (nats); actions below")
    return path


def main(backend: Any, savings: int, per_kind: int, groups: Sequence[str], out_dir: Path,
         advance: Callable[[str], None]) -> dict[str, Any]:
    """Run the benchmark and write ``groups.json`` and ``groups.png`` under ``out_dir``."""
    sets: dict[str, tuple[Sequence[Item], GravityConfig, float]] = {}
    if savings:
        sets["savings"] = (savings_items(savings), GravityConfig(), 0.0)
    if per_kind:
        sets["structured"] = (structured_items(per_kind), STRUCTURED_GRAVITY, 0.0)
    if savings and SAMPLED & set(groups):
        sets["sampled"] = (savings_items(savings), GravityConfig(), SAMPLING_TEMPERATURE)
    if not sets:
        raise ValueError("nothing to run: give --items or --per-kind above 0")
    report = run(backend, sets, groups, advance)
    write_json(out_dir / "groups.json", report)
    plot(report, out_dir / "groups.png")
    return report
