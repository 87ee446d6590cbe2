"""Surface: ``agent-gravity report TRACEFILE``, a self-contained HTML report and PNG figures of entropy traces.

For each call: the entropy curve, the gravity zone shaded, the lock, exit and loop stop marked,
reasoning and answer in different colours, and the tokens saved; then a summary across calls.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

import torch

from agent_gravity.bench._report import figure
from agent_gravity.telemetry._trace_file import ZONE as ZONE_DEFAULT

REASONING, ANSWER, MARKER, ZONE_COLOUR = "#6a3d9a", "#1b9e77", "#999999", "#fdd49e"
_NEEDED = ("entropy", "reasoning_tokens", "answer_tokens", "model", "response_id")


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """The calls of an entropy trace file; a missing file or a bad line is a ValueError saying where."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no entropy trace file at {path}; write one with TelemetryConfig(trace_file=...) "
                         "or `with entropy_trace(path):` around an agent run")
    calls = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            call = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not JSON ({exc.msg}); is it an agent-gravity entropy trace?") from exc
        missing = [k for k in _NEEDED if k not in call]
        if missing:
            raise ValueError(f"{path}:{number} lacks {', '.join(missing)}; is it an agent-gravity entropy trace?")
        calls.append(call)
    if not calls:
        raise ValueError(f"{path} holds no calls; run a model call inside entropy_trace() first")
    return calls


def _spans(positions: list[int]) -> list[tuple[int, int]]:
    """Runs of consecutive positions as ``(start, end)`` half-open intervals."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def rolling_mean(call: dict[str, Any]) -> list[float]:
    """The mean entropy of the ``window`` tokens ending at each position (NaN before a full window)."""
    window = int((call.get("zone") or ZONE_DEFAULT)["window"])
    e = torch.tensor([math.nan if v is None else v for v in call["entropy"]], dtype=torch.float64)
    if e.numel() < window:
        return [math.nan] * e.numel()
    means = e.unfold(0, window, 1).mean(dim=1)
    return [math.nan] * (window - 1) + means.tolist()


def zone_spans(call: dict[str, Any]) -> list[tuple[int, int]]:
    """The call's gravity zone: where the rolling mean entropy is under the policy's threshold."""
    threshold = (call.get("zone") or ZONE_DEFAULT)["threshold"]
    return _spans([i for i, m in enumerate(rolling_mean(call)) if m < threshold])


def segments(call: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Reasoning, closing marker and answer as token intervals of the output."""
    n, reasoning, answer = len(call["entropy"]), call["reasoning_tokens"], call["answer_tokens"]
    return {"reasoning": (0, reasoning), "marker": (reasoning, n - answer), "answer": (n - answer, n)}


def _plot_call(call: dict[str, Any], path: Path) -> None:
    entropy = [math.nan if e is None else e for e in call["entropy"]]
    title = f"{call['model']} {call['response_id']}: {call.get('reason') or 'no exit'}"
    with figure(path, title, "entropy (nats)", (11, 3.4), legend_outside=True) as ax:
        for i, (start, end) in enumerate(zone_spans(call)):
            ax.axvspan(start - 0.5, end - 0.5, color=ZONE_COLOUR, alpha=0.6, label="gravity zone" if i == 0 else None)
        zone = call.get("zone") or ZONE_DEFAULT
        ax.plot(rolling_mean(call), color="#b15928", lw=0.8, ls="-.", label=f"mean of last {zone['window']}")
        ax.axhline(zone["threshold"], color="#b15928", lw=0.6, ls=":", label=f"threshold {zone['threshold']:g}")
        for name, colour in (("reasoning", REASONING), ("marker", MARKER), ("answer", ANSWER)):
            start, end = segments(call)[name]
            if end > start:  # each segment joins the next so the curve has no gap
                xs = list(range(start, min(end + 1, len(entropy))))
                ax.plot(xs, [entropy[x] for x in xs], color=colour, lw=1.2, label=name)
        lock = call.get("lock")
        marks = [("loop" if lock and lock.get("reason") == "loop" else "lock", lock, "#e31a1c"),
                 ("loop stop", call.get("loop_stop"), "#000000")]
        if call.get("exit"):
            marks.append((f"exit ({call['exit']})", {"step": call["reasoning_tokens"]}, "#1f78b4"))
        for label, mark, colour in marks:
            if mark:
                ax.axvline(mark["step"], color=colour, ls="--", lw=1, label=f"{label} @ {mark['step']}")
        for i, step in enumerate(call.get("probe_steps") or []):
            ax.axvline(step, color="#ff7f00", ls=":", lw=0.8, label="answer probe" if i == 0 else None)
        ax.set_xlabel(f"output token (tokens saved, at most: {call.get('tokens_saved_upper_bound', 0)})")
        ax.set_xlim(-1, max(len(entropy), 1))


def summary(calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals across calls: tokens, early exits by reason, tokens saved (an upper bound), mean entropy."""
    finite = [e for c in calls for e in c["entropy"] if e is not None and math.isfinite(e)]
    reasons: dict[str, int] = {}
    for c in calls:
        if c.get("terminated_early"):
            reasons[c["reason"]] = reasons.get(c["reason"], 0) + 1
    return {"calls": len(calls), "output_tokens": sum(len(c["entropy"]) for c in calls),
            "reasoning_tokens": sum(c["reasoning_tokens"] for c in calls),
            "answer_tokens": sum(c["answer_tokens"] for c in calls),
            "tokens_saved_upper_bound": sum(c.get("tokens_saved_upper_bound") or 0 for c in calls),
            "early_exits": reasons, "kv_bytes_freed": sum(c.get("kv_bytes_freed") or 0 for c in calls),
            "entropy_mean": round(sum(finite) / len(finite), 3) if finite else None}


def _plot_summary(calls: list[dict[str, Any]], path: Path) -> None:
    xs = list(range(1, len(calls) + 1))
    reasoning = [c["reasoning_tokens"] for c in calls]
    rest = [len(c["entropy"]) - c["reasoning_tokens"] for c in calls]
    saved = [c.get("tokens_saved_upper_bound") or 0 for c in calls]
    with figure(path, "tokens per call", "tokens", (11, 3.4), legend_outside=True) as ax:
        ax.bar(xs, reasoning, color=REASONING, label="reasoning")
        ax.bar(xs, rest, bottom=reasoning, color=ANSWER, label="marker + answer")
        ax.bar(xs, saved, bottom=[r + a for r, a in zip(reasoning, rest)], color="white", edgecolor="#e31a1c",
               hatch="//", label="saved (budget left at the cut)")
        ax.set_xlabel("call")
        ax.set_xticks(xs)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}">'


def _call_section(i: int, call: dict[str, Any], png: Path) -> str:
    rows = [("reason", call.get("reason") or "-"), ("terminated early", call.get("terminated_early")),
            ("reasoning / answer tokens", f"{call['reasoning_tokens']} / {call['answer_tokens']}"),
            ("tokens saved (at most)", call.get("tokens_saved_upper_bound", 0)),
            ("lock", (call.get("lock") or {}).get("step", "-")),
            ("exit", f"{call['exit']} @ {call['reasoning_tokens']}" if call.get("exit") else "-"),
            ("conversation", call.get("conversation_id") or "-"), ("KV bytes freed", call.get("kv_bytes_freed", 0))]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return (f'<section class="call"><h2>Call {i}: {html.escape(call["response_id"])}</h2>'
            f"{_img(png, f'entropy curve of call {i}')}<table>{table}</table></section>")


_STYLE = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}img{max-width:100%}"
          "table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #ccc;padding:2px 8px;text-align:left}")


def render_report(trace: str | Path, out: str | Path) -> Path:
    """Write ``report.html`` (figures inlined) and its PNGs under ``out``; return the HTML's path."""
    calls, out = load_trace(trace), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for i, call in enumerate(calls, 1):
        png = out / f"call-{i:03d}.png"
        _plot_call(call, png)
        sections.append(_call_section(i, call, png))
    _plot_summary(calls, out / "summary.png")
    totals = summary(calls)
    rows = "".join(f"<tr><th>{html.escape(k.replace('_', ' '))}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in totals.items())
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>agent-gravity entropy report</title>"
            f"<style>{_STYLE}</style></head><body><h1>Entropy report: {html.escape(Path(trace).name)}</h1>"
            f'<section id="summary"><h2>Summary across {len(calls)} calls</h2><table>{rows}</table>'
            f"{_img(out / 'summary.png', 'tokens per call')}</section>{''.join(sections)}</body></html>")
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    (out / "summary.json").write_text(json.dumps(totals, indent=2))
    return path
