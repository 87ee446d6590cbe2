"""``agent-gravity bench kv``: bytes held against exact-value recall, for every trim policy and budget.

Each transcript is prefilled once into a session on the transformers backend; every (policy,
budget) trims its own fork of that session to about ``1 / budget`` of the full cache's entries,
then answers each question with its opening words prefilled, so the next tokens must be the
exact value. Questions come either after the trim (``unknown``: the cache could not know them)
or before it (``known``: the question is in the cache when it is trimmed). Per method: bytes held
(read from the tensors), exact-value recall, top-1 agreement with the full cache (teacher-forced
over the full cache's answer), time per turn and time per trim, each with a 95% interval over the transcripts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_gravity.backends.base import GenerationRequest, SamplingSettings, drain
from agent_gravity.backends.local_transformers import TransformersBackend
from agent_gravity.bench._report import figure, interval, write_json
from agent_gravity.bench._stats import mean_ci
from agent_gravity.bench.kv_tasks import TURNS, Question, Transcript
from agent_gravity.trim import GravityZone, TrimBudgetError, TrimPolicy, trim_policy_from_spec

POLICIES: dict[str, dict[str, Any]] = {
    "reconstruction": {"policy": {"name": "reconstruction"}},
    "head_entropy": {"policy": {"name": "head_entropy"}},
    "snapkv": {"policy": {"name": "snapkv"}},
    "streaming_llm": {"policy": {"name": "streaming_llm"}},
    "snapkv_protect": {"policy": {"name": "snapkv", "protect": True}},
    "int8_gravity": {"zone": {}},
    "head_entropy_int8": {"policy": {"name": "head_entropy"}, "zone": {}},
    "reconstruction_int8": {"policy": {"name": "reconstruction"}, "bits": 8},
}
"""Each method: a trim policy, gravity zones stored in 8 bits first, or both. Zones alone hold what they
hold (one row, budget 1: every entry stays); with a policy, the trim makes up the rest of the budget. With
``bits`` the trim stores what it keeps in that many bits, so it evicts only what the budget still needs."""
BUDGETS = (2, 4, 8)
MODES = ("unknown", "known")
GOAL = {"method": "reconstruction_int8", "budget": 4, "recall_of_full": 0.95, "agreement": 0.90,
        "beats": ("snapkv", "streaming_llm")}
"""The issue's goal: at 4x fewer bytes, 95% of the full cache's recall, 90% top-1 agreement, beating both rivals."""
SINKS, WINDOW = 4, 32


@dataclass(frozen=True)
class Answer:
    """One question answered on one cache."""

    text: str
    ids: list[int]
    seconds: float


@dataclass(frozen=True)
class Method:
    """What one benchmarked method does to a session: store its gravity zones in 8 bits, trim, or both."""

    policy: TrimPolicy | None
    zone: GravityZone | None
    bits: int | None = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Method:
        return cls(trim_policy_from_spec(spec["policy"]) if "policy" in spec else None,
                   GravityZone(**spec["zone"]) if "zone" in spec else None, spec.get("bits"))


def stretch_ratio(held: float, stretch: float, target: float, share: float = 1.0) -> float:
    """The trim ratio over a stretch of ``stretch`` bytes that brings ``held`` bytes down to ``target``, when
    every kept entry of the stretch then holds ``share`` of its bytes (stored in fewer bits)."""
    keep = stretch - (held - target)
    if keep <= 0 or keep < stretch / 1e4:
        raise TrimBudgetError(f"{held:.0f} bytes cannot come down to {target:.0f} by trimming a {stretch:.0f}-byte "
                              f"stretch: the {SINKS} sinks, the {WINDOW}-token window (and any 8-bit zones) hold "
                              "more; use longer transcripts or a smaller budget")
    return max(1.0, stretch * share / keep)


def stretch_bytes(backend: TransformersBackend, session: str) -> int:
    """Bytes of the full-precision entries the next trim of a session may evict (past its sinks, before its
    window, written since its last trim)."""
    s = backend.sessions[session]
    start, end = max(s.trimmed_until, SINKS), s.cache.next_position - WINDOW
    return sum(int(((h.positions >= start) & (h.positions < end)).sum()) *
               (h.keys.shape[1] * h.keys.element_size() * 2 + h.positions.element_size())
               for layer in s.cache.heads for h in layer)


def _prompt(backend: TransformersBackend, transcript: Transcript, q: Question) -> list[int]:
    return backend.render([*transcript.messages, {"role": "user", "content": q.question}], q.prefix)


def answer(backend: TransformersBackend, session: str, prompt: list[int], tokens: int) -> Answer:
    """Greedy answer on the session's cache; the history is never prefilled again."""
    start = time.perf_counter()
    result = drain(backend.stream(GenerationRequest(prompt, SamplingSettings(max_tokens=tokens), session=session)))
    seconds = time.perf_counter() - start
    if result.session is None or result.session.reset or not result.session.reused_tokens:
        raise RuntimeError(f"session {session!r} did not answer from its own cache ({result.session}); "
                           "the benchmark would measure a full prefill instead")
    return Answer(result.text, result.token_ids, seconds)


def recalled(text: str, value: str) -> bool:
    """The answer's first word is the exact value."""
    words = text.strip().split()
    return bool(words) and words[0].rstrip(".,;") == value


@dataclass(frozen=True)
class Trimmed:
    """A session trimmed by one method: its bytes held and how long the trim took."""

    session: str
    held: int
    seconds: float


def _trimmed(backend: TransformersBackend, source: str, name: str, method: Method, budget: float) -> Trimmed | str:
    """Fork ``source`` into ``name`` and apply the method; the reason when the budget cannot be reached."""
    backend.fork_session(source, name)
    cache = backend.sessions[name].cache
    full, start = cache.nbytes(), time.perf_counter()
    try:
        if method.zone is not None:
            backend.quantize(name, method.zone, SINKS, WINDOW)
        if method.policy is not None:
            share = 1.0 if method.bits is None else backend.kept_share(method.bits)
            ratio = stretch_ratio(cache.nbytes(), stretch_bytes(backend, name), full / budget, share)
            backend.trim(name, method.policy, ratio, SINKS, WINDOW, bits=method.bits)
    except TrimBudgetError as exc:  # e.g. 8-bit zones alone hold more than the budget: said, not hidden
        backend.end_session(name)
        return str(exc)
    return Trimmed(name, cache.nbytes(), time.perf_counter() - start)


def _budgets(method: Method, budgets: Sequence[float]) -> Sequence[float]:
    return budgets if method.policy is not None else [1]


def run_transcript(backend: TransformersBackend, t: Transcript, methods: dict[str, Method],
                   budgets: Sequence[float]) -> list[dict[str, Any]]:
    """Every method on one transcript: one row per (method, mode, question). A trim that cannot know the
    questions is made once per method and budget, and each question is answered on its own copy."""
    base = f"kv-{t.id}"
    drain(backend.stream(GenerationRequest(backend.render(t.messages), SamplingSettings(max_tokens=1), session=base)))
    unknown = {(name, budget): _trimmed(backend, base, f"{base}-{name}-{budget}", method, budget)
               for name, method in methods.items() for budget in _budgets(method, budgets)}
    rows = []
    for q in t.questions:
        prompt = _prompt(backend, t, q)
        backend.fork_session(base, f"{base}-full")
        full = answer(backend, f"{base}-full", prompt, len(backend.encode(" " + q.value)) + 2)
        full_bytes = backend.sessions[base].cache.nbytes()
        rows.append(_row(t, q, "full", 1, "unknown", full_bytes, full, full, [1.0], 0.0))
        for name, method in methods.items():
            for budget in _budgets(method, budgets):
                rows.append(_answered(backend, t, q, prompt, full, name, budget, "unknown", unknown[(name, budget)]))
                rows.append(_answered(backend, t, q, prompt, full, name, budget, "known",
                                      _known(backend, base, prompt, name, method, budget)))
        backend.end_session(f"{base}-full")
    for trimmed in unknown.values():
        if isinstance(trimmed, Trimmed):
            backend.end_session(trimmed.session)
    backend.end_session(base)
    return rows


def _known(backend: TransformersBackend, base: str, prompt: list[int], name: str, method: Method,
           budget: float) -> Trimmed | str:
    """The question read into the cache before the trim."""
    asked = f"{base}-{name}-{budget}-asked"
    backend.fork_session(base, asked)
    answer(backend, asked, prompt, 1)
    trimmed = _trimmed(backend, asked, f"{asked}-trimmed", method, budget)
    backend.end_session(asked)
    return trimmed


def _answered(backend: TransformersBackend, t: Transcript, q: Question, prompt: list[int], full: Answer, name: str,
              budget: float, mode: str, trimmed: Trimmed | str) -> dict[str, Any]:
    if isinstance(trimmed, str):
        return {"transcript": t.id, "family": t.family, "method": name, "budget": budget, "mode": mode,
                "unreachable": trimmed}
    sid = f"{trimmed.session}-answer"
    backend.fork_session(trimmed.session, sid)
    got = answer(backend, sid, prompt, len(full.ids))
    top1 = backend.teacher_force(sid, prompt, full.ids)
    backend.end_session(sid)
    if mode == "known":
        backend.end_session(trimmed.session)
    agree = [float(a == b) for a, b in zip(top1, full.ids)]
    return _row(t, q, name, budget, mode, trimmed.held, got, full, agree, trimmed.seconds)


def _row(t: Transcript, q: Question, method: str, budget: float, mode: str, held: int, got: Answer, full: Answer,
         agree: list[float], trim_seconds: float) -> dict[str, Any]:
    return {"transcript": t.id, "family": t.family, "turn": q.turn, "value": q.value, "method": method,
            "budget": budget, "mode": mode, "bytes": held, "recall": recalled(got.text, q.value),
            "full_recall": recalled(full.text, q.value),
            "agreement": sum(agree) / len(agree) if agree else 0.0, "seconds": got.seconds,
            "trim_seconds": trim_seconds, "answer": got.text}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (method, budget, mode): means over transcripts with 95% intervals; with several transcript families,
    the same per family, and the goal's worst family."""
    report = _summary(rows)
    names = sorted({r["family"] for r in rows})
    if len(names) > 1:
        families = {name: _summary([r for r in rows if r["family"] == name]) for name in names}
        report["families"] = families
        report["worst_family"] = _worst(families)
    return report


def _worst(families: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the family where ``GOAL["method"]`` keeps the least of the full cache's recall, and where it
    agrees least; and whether the goal holds in every family."""
    out: dict[str, Any] = {}
    for mode in MODES:
        checked = {name: f for name, f in families.items() if mode in f["goal"]}
        if not checked:
            continue
        share, agree = {}, {}
        for name, f in checked.items():
            full = _full_row(f["methods"])["recall"]["value"]
            ours = next(m for m in f["methods"] if (m["method"], m["budget"], m["mode"]) ==
                        (GOAL["method"], GOAL["budget"], mode))
            share[name] = ours["recall"]["value"] / full if full else None
            agree[name] = ours["agreement"]["value"]
        known = {n: v for n, v in share.items() if v is not None}
        out[mode] = {"recall_of_full": _least(known) if known else None, "agreement": _least(agree),
                     "no_full_recall": sorted(n for n, v in share.items() if v is None),
                     "goal_met_everywhere": all(_met(f["goal"][mode]) for f in checked.values())}
    return out


def _full_row(methods: list[dict[str, Any]]) -> dict[str, Any]:
    """The full cache's summary row among a summary's methods."""
    return next(m for m in methods if m["method"] == "full")


def _least(values: dict[str, float]) -> dict[str, Any]:
    family = min(values, key=values.__getitem__)
    return {"family": family, "value": values[family]}


def _met(goal: dict[str, Any]) -> bool:
    return goal["recall"] and goal["agreement"] and all(goal["beats"].values())


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    unreachable = sorted({(r["method"], r["budget"], r["mode"]) for r in rows if "unreachable" in r})
    for r in rows:
        if (r["method"], r["budget"], r["mode"]) in unreachable:
            continue
        groups.setdefault((r["method"], r["budget"], r["mode"]), []).append(r)
    full_bytes = _per_transcript(groups[("full", 1, "unknown")], "bytes")
    out = []
    for (method, budget, mode), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] != "full", kv[0])):
        held = _per_transcript(rs, "bytes")
        out.append({"method": method, "budget": budget, "mode": mode,
                    "bytes_held": mean_ci(held), "bytes_ratio": mean_ci([f / h for f, h in zip(full_bytes, held)]),
                    "recall": mean_ci(_per_transcript(rs, "recall")),
                    "agreement": mean_ci(_per_transcript(rs, "agreement")),
                    "seconds": mean_ci(_per_transcript(rs, "seconds")),
                    "trim_seconds": mean_ci(_per_transcript(rs, "trim_seconds")),
                    "recall_by_turn": {turn: _rate([r["recall"] for r in rs if r["turn"] == turn])
                                       for turn in TURNS}})
    return {"methods": out, "goal": _goal(out),
            "unreachable": [{"method": m, "budget": b, "mode": mode} for m, b, mode in unreachable]}


def _rate(values: list[bool]) -> float:
    return sum(values) / len(values) if values else 0.0


def _per_transcript(rows: list[dict[str, Any]], key: str) -> list[float]:
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["transcript"], []).append(float(r[key]))
    return [sum(v) / len(v) for _, v in sorted(by.items())]


def _goal(methods: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, whether ``GOAL["method"]`` at ``GOAL["budget"]`` keeps its share of the full cache's recall, its
    top-1 agreement, and beats each rival in the run (no worse on recall and agreement, better on one)."""
    full = _full_row(methods)["recall"]["value"]
    at = [m for m in methods if m["method"] == GOAL["method"] and m["budget"] == GOAL["budget"]]
    if not at:
        return {"checked": False}
    out: dict[str, Any] = {"checked": True, "method": GOAL["method"], "budget": GOAL["budget"]}
    for m in at:
        rivals = [r for r in methods if r["method"] in GOAL["beats"] and r["budget"] == m["budget"]
                  and r["mode"] == m["mode"]]
        recall, agree = m["recall"]["value"], m["agreement"]["value"]
        out[m["mode"]] = {"recall": recall >= GOAL["recall_of_full"] * full, "agreement": agree >= GOAL["agreement"],
                          "beats": {r["method"]: _beats((recall, agree), (r["recall"]["value"],
                                                                          r["agreement"]["value"])) for r in rivals}}
    return out


def _beats(ours: tuple[float, ...], theirs: tuple[float, ...]) -> bool:
    return all(a >= b for a, b in zip(ours, theirs)) and ours != theirs


def run(backend: TransformersBackend, transcripts: Sequence[Transcript], names: Sequence[str],
        budgets: Sequence[float], on_transcript: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The whole benchmark; the report keeps every row."""
    methods = {n: Method.from_spec(POLICIES[n]) for n in names}
    rows = []
    for t in transcripts:
        on_transcript(t.id)
        rows += run_transcript(backend, t, methods, budgets)
    return {**summarize(rows), "settings": {"transcripts": len(transcripts),
                                            "families": sorted({t.family for t in transcripts}),
                                            "policies": list(names),
                                            "budgets": list(budgets), "sinks": SINKS, "window": WINDOW,
                                            "model": backend.model_name}, "rows": rows}


def table(report: dict[str, Any]) -> str:
    """One row per method, budget and mode, with 95% intervals."""
    head = (f"{'method':<20} {'budget':>6} {'mode':>8} {'x fewer bytes':>20} {'recall %':>20} {'top-1 agree %':>20} "
            f"{'s/turn':>18} {'s/trim':>18}")
    lines = [head, "-" * len(head)]
    for m in report["methods"]:
        lines.append(f"{m['method']:<20} {m['budget']:>6} {m['mode']:>8} {interval(m['bytes_ratio'], 1, 2):>20} "
                     f"{interval(m['recall'], 100):>20} {interval(m['agreement'], 100):>20} "
                     f"{interval(m['seconds'], 1, 2):>18} {interval(m['trim_seconds'], 1, 2):>18}")
    lines += [f"{u['method']:<20} {u['budget']:>6} {u['mode']:>8}   unreachable: what must stay holds more"
              for u in report.get("unreachable", [])]
    goal = report["goal"]
    lines += [f"goal ({goal['method']}, {goal['budget']}x, {mode}): "
              + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in goal[mode].items() if k != "beats")
              + "".join(f", beats {r} {'yes' if v else 'no'}" for r, v in goal[mode]["beats"].items())
              for mode in MODES if goal["checked"] and mode in goal]
    return "\n".join(lines + _family_lines(report))


def _family_lines(report: dict[str, Any]) -> list[str]:
    """Per family and trimmed method: recall beside the full cache's, and top-1 agreement; then the worst family."""
    if "families" not in report:
        return []
    head = f"{'family':<8} {'method':<20} {'budget':>6} {'mode':>8} {'recall % (full %)':>18} {'top-1 agree %':>14}"
    lines = ["", "by transcript family (intervals in the JSON):", head, "-" * len(head)]
    for name, f in report["families"].items():
        full = _full_row(f["methods"])["recall"]["value"]
        for m in (m for m in f["methods"] if m["method"] != "full"):
            recall = f"{100 * m['recall']['value']:.1f} ({100 * full:.1f})"
            lines.append(f"{name:<8} {m['method']:<20} {m['budget']:>6} {m['mode']:>8} {recall:>18} "
                         f"{100 * m['agreement']['value']:>14.1f}")
    for mode, w in report["worst_family"].items():
        share = ("-" if w["recall_of_full"] is None else
                 f"{100 * w['recall_of_full']['value']:.1f}% of the full cache's ({w['recall_of_full']['family']})")
        lines.append(f"worst family ({GOAL['method']}, {GOAL['budget']}x, {mode}): recall {share}, agreement "
                     f"{100 * w['agreement']['value']:.1f}% ({w['agreement']['family']})"
                     + (f"; the full cache recalls nothing in {', '.join(w['no_full_recall'])}"
                        if w["no_full_recall"] else "")
                     + f"; goal met in every family: {'yes' if w['goal_met_everywhere'] else 'no'}")
    return lines


def plot(report: dict[str, Any], path: Path) -> Path:
    """Recall against bytes held (as x fewer than the full cache), one line per method and mode."""
    with figure(path, "bench kv: exact-value recall against bytes held", "recall %", (9, 4.5), ncols=2) as axes:
        for ax, mode in zip(axes, MODES):
            full = _full_row(report["methods"])
            ax.scatter([1], [full["recall"]["value"] * 100], color="black", label="full cache", zorder=3)
            for name in report["settings"]["policies"]:
                ms = [m for m in report["methods"] if m["method"] == name and m["mode"] == mode]
                ax.errorbar([m["bytes_ratio"]["value"] for m in ms], [m["recall"]["value"] * 100 for m in ms],
                            yerr=[[100 * (m["recall"]["value"] - m["recall"]["lo"]) for m in ms],
                                  [100 * (m["recall"]["hi"] - m["recall"]["value"]) for m in ms]],
                            marker="o", capsize=3, label=name)
            ax.set_xlabel("x fewer bytes held than the full cache")
            ax.set_title(f"questions {mode} when trimmed")
    return path


def main(backend: TransformersBackend, transcripts: Sequence[Transcript], names: Sequence[str],
         budgets: Sequence[float], out_dir: Path, on_transcript: Callable[[str], None]) -> dict[str, Any]:
    """Run the benchmark and write ``kv.json`` and ``kv.png`` under ``out_dir``."""
    report = run(backend, transcripts, names, budgets, on_transcript)
    write_json(out_dir / "kv.json", report)
    plot(report, out_dir / "kv.png")
    return report
