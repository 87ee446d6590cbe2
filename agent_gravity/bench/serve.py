"""``agent-gravity bench serve``: the vLLM plugin's overhead, and the gravity proxy under load, in one run.

Three vLLM servers start on loopback for the embedded model: two with the agent-gravity plugin, one
without. **Overhead**: the same greedy requests, carrying no gravity settings and a fixed token count
(``ignore_eos``), go alternately to a plugin server and to the plain one, one at a time and in concurrent
batches; the figure is plugin time over plain time, with a paired bootstrap interval. **Load**: the gravity
proxy (in this process) spreads ``streams`` concurrent chat-completion streams over both plugin servers.
Each request asks for its own token count with gravity off (its trace is still recorded), so a trace
handed to the wrong request would show in its length; the report counts lost and mixed-up requests and
gives latency percentiles. Each plugin server answers one short request first: a cold vLLM server's first
batch pays its warm-up (seconds alone, far longer while the other server busies the same cores).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from agent_gravity.backends._openai_wire import sse_data
from agent_gravity.bench._report import figure, percentiles, write_json
from agent_gravity.bench._stats import ratio_ci
from agent_gravity.bench.overhead import PROMPTS

COUNTING = "Count from 1 to 500, separated by commas."


@dataclass
class Timed:
    """One request of the load test, as its client saw it."""

    index: int
    asked_tokens: int
    ok: bool
    error: str | None = None
    sent_s: float | None = None
    """When it was sent, in seconds from the load test's start."""
    first_token_s: float | None = None
    total_s: float | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    trace_tokens: int | None = None

    @property
    def consistent(self) -> bool:
        """Its trace is its own: one entropy per token it got, and all it asked for where it ran to length."""
        own = self.trace_tokens == self.completion_tokens
        return own and (self.finish_reason != "length" or self.completion_tokens == self.asked_tokens)


# -- the plugin's overhead ---------------------------------------------------------------------------


def _fixed_length(model: str, prompt: str, tokens: int) -> dict[str, Any]:
    """A greedy completion body that runs to exactly ``tokens`` tokens, without gravity settings."""
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}


def _completion(client: httpx.Client, url: str, model: str, prompt: str, tokens: int) -> float:
    start = time.perf_counter()
    response = client.post(url + "/completions", json=_fixed_length(model, prompt, tokens))
    response.raise_for_status()
    return time.perf_counter() - start


def _batch(url: str, model: str, batch: int, tokens: int, offset: int) -> float:
    """Seconds for ``batch`` concurrent requests to finish."""
    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = _fixed_length(model, PROMPTS[(offset + i) % len(PROMPTS)], tokens)
        (await client.post(url + "/completions", json=body)).raise_for_status()

    async def all_of() -> float:
        async with httpx.AsyncClient(timeout=600) as client:
            start = time.perf_counter()
            await asyncio.gather(*(one(client, i) for i in range(batch)))
            return time.perf_counter() - start

    return asyncio.run(all_of())


def plugin_overhead(plugin_url: str, plain_url: str, model: str, rounds: int, tokens: int, batch: int,
                    advance: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Plugin time over plain time for requests without gravity settings, alternating arms (ABBA) per round."""
    single = {"plugin": [], "plain": []}
    batched = {"plugin": [], "plain": []}
    arms = {"plugin": plugin_url, "plain": plain_url}
    with httpx.Client(timeout=600) as client:
        for name, url in arms.items():  # warm both: first requests pay for allocations
            _completion(client, url, model, PROMPTS[0], 4)
        for r in range(rounds):
            order = ("plugin", "plain") if r % 2 == 0 else ("plain", "plugin")
            for name in order:
                single[name].append(_completion(client, arms[name], model, PROMPTS[r % len(PROMPTS)], tokens))
            for name in order:
                batched[name].append(_batch(arms[name], model, batch, tokens, r))
            advance(f"overhead round {r + 1}/{rounds}")
    return {
        "rounds": rounds, "tokens": tokens, "batch": batch,
        "single_ratio": ratio_ci(single["plain"], single["plugin"]),
        "batch_ratio": ratio_ci(batched["plain"], batched["plugin"]),
        "single_s": {k: statistics.fmean(v) for k, v in single.items()},
        "batch_s": {k: statistics.fmean(v) for k, v in batched.items()},
    }


# -- the proxy under load ----------------------------------------------------------------------------


async def _stream(client: httpx.AsyncClient, url: str, model: str, index: int, tokens: int,
                  headers: dict[str, str], began: float) -> Timed:
    body = {"model": model, "messages": [{"role": "user", "content": COUNTING}], "max_tokens": tokens,
            "stream": True, "stream_options": {"include_usage": True},
            "gravity": {"enabled": False, "reasoning": None}}
    start = time.perf_counter()
    timed = Timed(index, tokens, ok=False, sent_s=start - began)
    try:
        async with client.stream("POST", url + "/chat/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                timed.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return timed
            async for line in response.aiter_lines():
                if (event := sse_data(line)) is not None:
                    read_event(timed, event, start)
        timed.total_s = time.perf_counter() - start
        timed.ok = timed.finish_reason is not None and timed.completion_tokens is not None
        if not timed.ok:
            timed.error = timed.error or "the stream ended without a finish reason and usage"
    except httpx.HTTPError as exc:
        timed.error = f"{exc.__class__.__name__}: {exc}"
    return timed


def read_event(timed: Timed, event: dict[str, Any], start: float) -> None:
    if "error" in event:
        timed.error = str(event["error"])
        return
    for choice in event.get("choices") or []:
        if timed.first_token_s is None and (choice.get("delta") or {}).get("content"):
            timed.first_token_s = time.perf_counter() - start
        if choice.get("finish_reason"):
            timed.finish_reason = choice["finish_reason"]
    if event.get("gravity"):
        timed.trace_tokens = len(event["gravity"].get("entropy") or [])
    if event.get("usage"):
        timed.completion_tokens = event["usage"]["completion_tokens"]


def load_test(proxy_url: str, model: str, streams: int, requests: int, min_tokens: int = 8,
              api_key: str | None = None) -> dict[str, Any]:
    """``requests`` chat-completion streams through the proxy, ``streams`` at a time, each asking for its own
    token count (``min_tokens`` upward); every request is accounted for."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def run() -> tuple[list[Timed], float]:
        gate = asyncio.Semaphore(streams)
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            async def gated(i: int) -> Timed:
                async with gate:
                    return await _stream(client, proxy_url, model, i, min_tokens + i % 64, headers, start)

            start = time.perf_counter()
            done = await asyncio.gather(*(gated(i) for i in range(requests)))
            return list(done), time.perf_counter() - start

    timed, seconds = asyncio.run(run())
    return summarize_load(timed, seconds, streams)


def summarize_load(timed: list[Timed], seconds: float, streams: int) -> dict[str, Any]:
    """Counts of lost and mixed-up requests, and latency percentiles, of a load test's requests."""
    ok = [t for t in timed if t.ok]
    tokens = sum(t.completion_tokens or 0 for t in ok)
    return {
        "streams": streams, "requests": len(timed), "completed": len(ok), "lost": len(timed) - len(ok),
        "mixed_up": sum(not t.consistent for t in ok), "ran_to_length": sum(t.finish_reason == "length" for t in ok),
        "errors": sorted({t.error for t in timed if t.error})[:5],
        "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0,
        "first_token_s": percentiles([t.first_token_s for t in ok if t.first_token_s is not None]),
        "total_s": percentiles([t.total_s for t in ok if t.total_s is not None]),
        "per_request": [asdict(t) for t in timed],
    }


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve an ASGI app on a free loopback port, in a thread of this process; yields its base URL."""
    import uvicorn

    from agent_gravity.bench.vllm_servers import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="agent-gravity-proxy", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on 127.0.0.1:{port}")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# -- the benchmark -----------------------------------------------------------------------------------


def main(out: Path, streams: int, requests: int, rounds: int, tokens: int, batch: int,
         advance: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Start the servers, measure, stop them; write ``serve.json`` and ``serve.png`` under ``out``."""
    from agent_gravity import ChatGravity, _model_store
    from agent_gravity.bench.vllm_servers import ServerSpec, servers
    from agent_gravity.serve import CLIENT_SETTINGS, MAX_CONCURRENCY, create_app

    folder, name = str(_model_store.pull()), _model_store.DEFAULT_MODEL.name
    specs = [ServerSpec(folder, name), ServerSpec(folder, name), ServerSpec(folder, name, plugin=False)]
    advance("starting three vLLM servers")
    with servers(specs, out / "logs") as (a, b, plain):
        overhead = plugin_overhead(a.url, plain.url, name, rounds, tokens, batch, advance)
        for server in (a, b):  # a cold server's first batch pays vLLM's warm-up; load measures the steady state
            httpx.post(server.url + "/completions", json={"model": name, "prompt": COUNTING, "max_tokens": 8,
                                                          "logprobs": 20}, timeout=600).raise_for_status()
        advance(f"load: {requests} streams through the proxy, {streams} at a time")
        app = create_app(ChatGravity(base_url=[a.url, b.url]), client_settings=CLIENT_SETTINGS | {"reasoning"},
                         max_concurrency=max(streams, MAX_CONCURRENCY))
        with serving(app) as url:
            load = load_test(url + "/v1", name, streams, requests)
    report = {"model": name, "overhead": overhead, "load": load, "per_request": load.pop("per_request")}
    write_json(out / "serve.json", report)
    _plot(out / "serve.png", report)
    return report


def _plot(path: Path, report: dict[str, Any]) -> None:
    """A timeline: each request a line from when it was sent to its end, its first token marked."""
    load = report["load"]
    done = [r for r in report["per_request"] if r["ok"]]
    with figure(path, f"gravity proxy: {load['requests']} streams, {load['streams']} at a time",
                "request", (7, 3.5)) as ax:
        ax.hlines([r["index"] for r in done], [r["sent_s"] for r in done],
                  [r["sent_s"] + r["total_s"] for r in done], linewidth=0.8, label="sent to last token")
        ax.scatter([r["sent_s"] + (r["first_token_s"] or 0) for r in done], [r["index"] for r in done], s=4,
                   color="tab:orange", label="first token", zorder=3)
        ax.set_xlabel("seconds from the start")


def table(report: dict[str, Any]) -> str:
    """The report as a short text table."""
    o, load = report["overhead"], report["load"]

    def ratio(r: dict[str, float]) -> str:
        return f"{r['value']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]"

    def pct(p: dict[str, float]) -> str:
        return " ".join(f"{k} {v:.2f}" for k, v in p.items()) or "-"

    return "\n".join([
        f"plugin overhead on requests without gravity settings ({o['rounds']} rounds, {o['tokens']} tokens each):",
        f"  one at a time   plugin/plain time {ratio(o['single_ratio'])}",
        f"  batch of {o['batch']:<6} plugin/plain time {ratio(o['batch_ratio'])}",
        f"proxy load: {load['requests']} requests, {load['streams']} concurrent streams, two plugin servers:",
        f"  completed {load['completed']}, lost {load['lost']}, mixed up {load['mixed_up']}, "
        f"{load['tokens_per_s']:.1f} tokens/s over {load['seconds']:.1f} s",
        f"  first token s   {pct(load['first_token_s'])}",
        f"  whole stream s  {pct(load['total_s'])}",
    ])
