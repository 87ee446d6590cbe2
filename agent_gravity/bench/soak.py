"""``agent-gravity bench soak``: the gravity proxy under a long, mixed, partly hostile load.

The proxy runs in this process on loopback, the local engine behind it. A seeded mix of requests goes
through it, ``concurrency`` at a time: plain completions, streams, forced tool calls and JSON-schema
output; 10% of the clients leave mid-stream and 5% send bad bodies. Every request is accounted for:

- ``completed``: a 200 whose report is its own: one entropy per generated token, and (plain and stream
  requests run a counting prompt to a token count of their own) exactly the tokens it asked for;
- ``left``: the client went away after its first event, by design;
- ``refused``: a bad body answered with a 4xx that names the problem;
- ``lost``: anything else (an error, a 5xx, a bad body accepted, a forced tool call without one);
- ``crossed``: a 200 carrying a report that is not its own.

Lost and crossed must be 0. The process's resident memory is sampled as the requests finish: its growth over
the second half must level off against the first (engine warm-up, caches) rather than go on.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from agent_gravity.bench._report import figure, percentiles, write_json
from agent_gravity.bench.serve import COUNTING, Timed, read_event, serving

KINDS = ("plain", "stream", "tools", "structured", "leave", "bad")
WEIGHTS = (0.2125, 0.2125, 0.2125, 0.2125, 0.10, 0.05)
OFF = {"enabled": False, "reasoning": None}
"""Gravity off and no reasoning scaffold: the trace is still recorded, and each request's length is its own."""
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look an item up in the stock table.",
                                         "parameters": {"type": "object", "properties": {
                                             "item": {"type": "string", "enum": ["apples", "limes", "pears"]}},
                                             "required": ["item"], "additionalProperties": False}}}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
    "type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["answer"], "additionalProperties": False}}}
BAD_BODIES: tuple[bytes, ...] = (
    b"{not json",
    json.dumps({"messages": "hello"}).encode(),
    json.dumps({"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}).encode(),
    json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 3}).encode(),
    json.dumps({"messages": [{"role": "user", "content": "hi"}], "gravity": {"max_answer_tokens": 10**9}}).encode(),
    json.dumps({"messages": [{"role": "user", "content": "hi"}],
                "gravity": {"loop": {"name": "loop", "max_period": 10**9}}}).encode(),
    json.dumps({"messages": []}).encode(),
)
"""Bodies the proxy must refuse with a 4xx: broken JSON, wrong types, unknown or unsupported fields, settings
past their bounds or outside the operator's allowlist."""


@dataclass
class Outcome:
    """One request of the soak, as its client saw it."""

    index: int
    kind: str
    status: str
    """``completed``, ``left``, ``refused``, ``lost`` or ``crossed``."""
    total_s: float | None = None
    error: str | None = None


def plan(requests: int, seed: int) -> list[str]:
    """The seeded kind of each request."""
    return random.Random(seed).choices(KINDS, WEIGHTS, k=requests)


def _tokens(index: int) -> int:
    """The token count a counting request asks for: each of 12 neighbours in flight asks for another."""
    return 4 + index % 12


def _counting(index: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": COUNTING}], "max_tokens": _tokens(index), "gravity": OFF,
            **extra}


def _body(kind: str, index: int) -> dict[str, Any]:
    if kind == "tools":
        return {"messages": [{"role": "user", "content": "How many limes are in stock?"}], "tools": [TOOL],
                "tool_choice": "required", "max_tokens": 64, "gravity": OFF}
    if kind == "structured":
        return {"messages": [{"role": "user", "content": "What is 12 plus 30? Reply in JSON."}],
                "response_format": SCHEMA, "max_tokens": 24, "gravity": OFF}
    return _counting(index)


def _judge(kind: str, index: int, reply: dict[str, Any]) -> tuple[str, str | None]:
    """Whether a 200 reply is complete and its own."""
    choice, usage, report = reply["choices"][0], reply.get("usage") or {}, reply.get("gravity") or {}
    tokens = usage.get("completion_tokens")
    if tokens is None or len(report.get("entropy") or []) != tokens:
        return "crossed", f"{len(report.get('entropy') or [])} entropies for {tokens} tokens"
    finish, message = choice.get("finish_reason"), choice.get("message") or {}
    if kind == "plain" and finish == "length" and tokens != _tokens(index):
        return "crossed", f"asked for {_tokens(index)} tokens, got {tokens}"
    if kind == "tools":
        calls = message.get("tool_calls") or []
        if not calls or calls[0]["function"]["name"] != "lookup" or "item" not in json.loads(
                calls[0]["function"]["arguments"]):
            return "lost", f"a forced tool call came back without one ({finish})"
    if kind == "structured" and finish == "stop" and "answer" not in json.loads(message.get("content") or "{}"):
        return "lost", "a JSON-schema reply without its field"
    return "completed", None


async def _request(client: httpx.AsyncClient, kind: str, index: int) -> Outcome:
    start = time.perf_counter()
    url = "/v1/chat/completions"
    try:
        if kind == "bad":
            response = await client.post(url, content=BAD_BODIES[index % len(BAD_BODIES)],
                                         headers={"content-type": "application/json"})
            message = response.json().get("error", {}).get("message") if response.content else None
            if 400 <= response.status_code < 500 and message:
                return Outcome(index, kind, "refused", time.perf_counter() - start)
            return Outcome(index, kind, "lost", error=f"a bad body got HTTP {response.status_code}")
        if kind in ("stream", "leave"):
            return await _stream(client, kind, index, start)
        response = await client.post(url, json=_body(kind, index))
        if response.status_code != 200:
            return Outcome(index, kind, "lost", error=f"HTTP {response.status_code}: {response.text[:200]}")
        status, error = _judge(kind, index, response.json())
        return Outcome(index, kind, status, time.perf_counter() - start, error)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return Outcome(index, kind, "lost", error=f"{type(exc).__name__}: {exc}")


async def _stream(client: httpx.AsyncClient, kind: str, index: int, start: float) -> Outcome:
    """A stream read to its end (``stream``), or left after its first event (``leave``)."""
    timed = Timed(index, _tokens(index), ok=False)
    body = _counting(index, stream=True, stream_options={"include_usage": True})
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return Outcome(index, kind, "lost", error=f"HTTP {response.status_code}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            if kind == "leave":
                return Outcome(index, kind, "left", time.perf_counter() - start)  # closing the response leaves
            if line.strip() != "data: [DONE]":
                read_event(timed, json.loads(line[5:]), start)
    if timed.error or timed.finish_reason is None or timed.completion_tokens is None:
        return Outcome(index, kind, "lost", error=timed.error or "the stream ended without a finish and usage")
    return Outcome(index, kind, "completed" if timed.consistent else "crossed", time.perf_counter() - start,
                   None if timed.consistent else f"{timed.trace_tokens} entropies for {timed.completion_tokens}")


def _rss() -> int:
    return psutil.Process().memory_info().rss


async def soak(url: str, kinds: list[str], concurrency: int,
               advance: Callable[[int], None] = lambda _: None) -> tuple[list[Outcome], list[tuple[float, int, int]]]:
    """Send every request, ``concurrency`` at a time; the outcomes and the memory samples (seconds, requests
    finished, resident bytes), the first taken before any request and the last after all."""
    gate, done, samples = asyncio.Semaphore(concurrency), 0, []
    began = time.perf_counter()
    samples.append((0.0, 0, _rss()))

    async def one(client: httpx.AsyncClient, i: int, kind: str) -> Outcome:
        nonlocal done
        async with gate:
            outcome = await _request(client, kind, i)
        done += 1
        if done % max(1, len(kinds) // 100) == 0:
            samples.append((time.perf_counter() - began, done, _rss()))
            advance(done)
        return outcome

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        outcomes = await asyncio.gather(*(one(client, i, kind) for i, kind in enumerate(kinds)))
    samples.append((time.perf_counter() - began, done, _rss()))
    return list(outcomes), samples


def summarize(outcomes: list[Outcome], samples: list[tuple[float, int, int]], seconds: float,
              concurrency: int) -> dict[str, Any]:
    """Counts by status and kind, latency percentiles of completed requests, and memory at start, middle, end."""
    statuses = Counter(o.status for o in outcomes)
    half = len(outcomes) / 2
    start, end = samples[0][2], samples[-1][2]
    middle = min(samples, key=lambda s: abs(s[1] - half))[2]
    first, second = middle - start, end - middle
    return {
        "requests": len(outcomes), "concurrency": concurrency, "seconds": seconds,
        **{status: statuses[status] for status in ("completed", "left", "refused", "lost", "crossed")},
        "completed_by_kind": dict(Counter(o.kind for o in outcomes if o.status == "completed")),
        "errors": sorted({o.error for o in outcomes if o.status in ("lost", "crossed") and o.error})[:5],
        "latency_s": percentiles([o.total_s for o in outcomes if o.status == "completed" and o.total_s]),
        "rss_mb": {"start": start / 2**20, "middle": middle / 2**20, "end": end / 2**20},
        "rss_growth_mb": {"first_half": first / 2**20, "second_half": second / 2**20},
        "goal": {"lost": statuses["lost"] == 0, "crossed": statuses["crossed"] == 0,
                 "memory_levels_off": second <= max(0.5 * first, 0.02 * start)},
    }


def main(out: Path, requests: int = 2000, concurrency: int = 16, seed: int = 0, model: str | None = None,
         advance: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start the proxy on the local engine, soak it; write ``soak.json`` and ``soak.png`` under ``out``."""
    from agent_gravity import ChatGravity
    from agent_gravity.serve import CLIENT_SETTINGS, MAX_CONCURRENCY, create_app

    advance("starting the engine")
    chat = ChatGravity(model=model)
    chat.get_backend()
    app = create_app(chat, client_settings=CLIENT_SETTINGS | {"reasoning"},
                     max_concurrency=max(concurrency, MAX_CONCURRENCY))
    kinds = plan(requests, seed)
    with serving(app) as url:
        warm = asyncio.run(_warm_up(url))  # the engine's first batch and grammar compile are not what is soaked
        began = time.perf_counter()
        outcomes, samples = asyncio.run(soak(url, kinds, concurrency,
                                             lambda n: advance(f"{n}/{requests} requests")))
    report = {"seed": seed, "warm_up": warm, **summarize(outcomes, samples, time.perf_counter() - began,
                                                          concurrency),
              "memory": samples, "per_request": [asdict(o) for o in outcomes]}
    write_json(out / "soak.json", report)
    _plot(out / "soak.png", report)
    return report


async def _warm_up(url: str) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        return [(await _request(client, kind, i)).status for i, kind in enumerate(("plain", "tools", "structured"))]


def _plot(path: Path, report: dict[str, Any]) -> None:
    with figure(path, f"proxy soak: {report['requests']} requests, {report['concurrency']} at a time",
                "resident memory (MiB)", (7, 3.5)) as ax:
        done = [s[1] for s in report["memory"]]
        ax.plot(done, [s[2] / 2**20 for s in report["memory"]], label="this process (proxy and engine)")
        ax.axvline(report["requests"] / 2, color="grey", linestyle=":", label="middle")
        ax.set_xlabel("requests finished")


def table(report: dict[str, Any]) -> str:
    """The report as a short text table."""
    pct = " ".join(f"{k} {v:.2f}" for k, v in report["latency_s"].items()) or "-"
    rss, growth, goal = report["rss_mb"], report["rss_growth_mb"], report["goal"]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report["completed_by_kind"].items()))
    return "\n".join([
        f"soak: {report['requests']} requests through the proxy, {report['concurrency']} at a time, "
        f"{report['seconds']:.0f} s",
        f"  completed {report['completed']} ({kinds}), left mid-stream {report['left']}, bad bodies refused "
        f"{report['refused']}, lost {report['lost']}, crossed {report['crossed']}",
        f"  latency s (completed)  {pct}",
        f"  resident memory MiB    start {rss['start']:.0f}, middle {rss['middle']:.0f}, end {rss['end']:.0f} "
        f"(growth: first half {growth['first_half']:+.0f}, second half {growth['second_half']:+.0f})",
        *(f"  error: {e}" for e in report["errors"]),
        f"  goal (lost 0, crossed 0, second-half growth <= half the first's or 2% of start): "
        f"{'met' if all(goal.values()) else 'not met'} ({', '.join(f'{k}: {v}' for k, v in goal.items())})",
    ])
