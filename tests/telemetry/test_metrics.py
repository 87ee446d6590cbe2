"""Metrics on the real engine: GenAI token usage, duration and first chunk; exits by reason and tokens saved."""

from __future__ import annotations

import pytest

from tests.conftest import metric_points

pytestmark = pytest.mark.engine

LOOPING = "If a shirt costs 20 dollars and is 25% off, what is the price?"
BASE = {("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "vllm"),
        ("gen_ai.request.model", "SmolLM2-135M-Instruct"), ("gen_ai.response.model", "SmolLM2-135M-Instruct")}


def delta(name: str, before: dict, extra: set) -> float:
    key = frozenset(BASE | extra)
    return metric_points(name).get(key, 0) - before.get(key, 0)


def test_a_call_records_token_usage_duration_first_chunk_its_exit_and_what_it_saved(chat):
    names = ("gen_ai.client.token.usage", "gen_ai.client.operation.duration",
             "gen_ai.client.operation.time_to_first_chunk", "agent_gravity.exits",
             "agent_gravity.tokens_saved_upper_bound")
    before = {n: metric_points(n) for n in names}
    msg = chat.invoke(LOOPING)
    g, usage = msg.response_metadata["gravity"], msg.usage_metadata
    assert g["terminated_early"] and g["tokens_saved_upper_bound"] > 0
    tokens = "gen_ai.client.token.usage"
    assert delta(tokens, before[tokens], {("gen_ai.token.type", "input")}) == usage["input_tokens"]
    assert delta(tokens, before[tokens], {("gen_ai.token.type", "output")}) == usage["output_tokens"]
    duration = delta("gen_ai.client.operation.duration", before["gen_ai.client.operation.duration"], set())
    first = delta("gen_ai.client.operation.time_to_first_chunk",
                  before["gen_ai.client.operation.time_to_first_chunk"], set())
    assert 0 < first < duration
    reason = {("agent_gravity.reason", "gravity")}
    assert delta("agent_gravity.exits", before["agent_gravity.exits"],
                 reason | {("agent_gravity.terminated_early", True)}) == 1
    saved = "agent_gravity.tokens_saved_upper_bound"
    assert delta(saved, before[saved], reason) == g["tokens_saved_upper_bound"]
