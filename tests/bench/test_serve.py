"""bench serve's measuring parts on stand-in servers (the full run needs three vLLM servers: `agent-gravity bench
serve`)."""

from __future__ import annotations

import math

from fastapi import FastAPI

from agent_gravity.bench.serve import Timed, percentiles, plugin_overhead, serving, summarize_load, table


def _completions_server(seen: list[dict]) -> FastAPI:
    app = FastAPI()

    @app.post("/completions")
    async def completions(body: dict) -> dict:
        seen.append(body)
        return {"choices": [{"text": "x"}]}

    return app


def test_overhead_alternates_fixed_length_requests_without_gravity_settings_over_both_arms():
    plugin, plain = [], []
    with serving(_completions_server(plugin)) as a, serving(_completions_server(plain)) as b:
        report = plugin_overhead(a, b, "m", rounds=2, tokens=5, batch=3)
    for seen in (plugin, plain):
        assert len(seen) == 1 + 2 * (1 + 3)  # a warm-up, then per round one alone and a batch of three
        assert all(r["ignore_eos"] and r["temperature"] == 0 and "vllm_xargs" not in r for r in seen)
        assert [r["max_tokens"] for r in seen[1:]] == [5] * 8
    for ratio in (report["single_ratio"], report["batch_ratio"]):
        assert ratio["n"] == 2 and ratio["lo"] <= ratio["value"] <= ratio["hi"] and math.isfinite(ratio["value"])


def test_a_load_report_counts_lost_and_mixed_up_requests_and_reads_as_a_table():
    timed = [Timed(0, 8, True, sent_s=0.0, first_token_s=0.1, total_s=1.0, finish_reason="length",
                   completion_tokens=8, trace_tokens=8),
             Timed(1, 9, True, sent_s=0.0, first_token_s=0.2, total_s=2.0, finish_reason="length",
                   completion_tokens=9, trace_tokens=7),  # another request's trace
             Timed(2, 10, False, error="HTTP 502")]
    load = summarize_load(timed, seconds=2.0, streams=3)
    assert (load["completed"], load["lost"], load["mixed_up"], load["errors"]) == (2, 1, 1, ["HTTP 502"])
    assert load["tokens_per_s"] == 8.5 and load["total_s"] == {"p50": 1.0, "p90": 2.0, "p99": 2.0, "max": 2.0}
    assert percentiles([]) == {}
    ratio = {"value": 1.0, "lo": 0.9, "hi": 1.1, "n": 2}
    text = table({"overhead": {"rounds": 2, "tokens": 5, "batch": 3, "single_ratio": ratio, "batch_ratio": ratio},
                  "load": load})
    assert "lost 1, mixed up 1" in text and "plugin/plain time 1.000 [0.900, 1.100]" in text
