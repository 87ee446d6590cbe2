"""The shared policy suite on the real engine: every policy, fed by the kernel inside vLLM."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from agent_gravity import GravityConfig, ProbeConfig
from agent_gravity.backends.base import drain
from agent_gravity.policies import POLICIES, Observation, policy_from_spec

pytestmark = pytest.mark.engine

# The embedded model loops on the first and settles quickly on the second (seen on this engine).
QUESTIONS = ("If a shirt costs 20 dollars and is 25% off, what is the price?",
             "Tom has 3 apples and buys 5 more. How many apples does he have?")
OFF = GravityConfig(enabled=False)


def only(name: str) -> GravityConfig:
    spec = {"name": name}
    if name == "loop":
        return GravityConfig(policy=None, probe=None, loop=spec)
    return GravityConfig(policy=spec, probe=None, loop=None)


def run(chat, question: str, config: GravityConfig):
    call = chat._prepare([HumanMessage(question)], None, {"gravity": config})
    return call, drain(call.backend.stream(call.request))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_fires_in_engine_exactly_where_a_replay_of_its_trace_does(chat, name):
    fired = 0
    for question in QUESTIONS:
        call, result = run(chat, question, only(name))
        steering = result.steering
        assert len(steering.entropy) >= len(result.token_ids) and len(steering.varentropy) == len(steering.entropy)
        answer = result.token_ids[steering.answer_start:] if steering.answer_start is not None else []
        assert chat.get_backend().decode(answer).strip(), "an answer always follows the reasoning"
        if not steering.terminated_early:
            continue
        fired += 1
        lock = steering.lock
        assert steering.reason == ("loop" if name == "loop" else "gravity") == lock.reason
        assert lock.step + 1 >= call.request.steering.min_tokens
        replay = policy_from_spec({"name": name})
        seen = [replay.observe(Observation(s, result.token_ids[s], steering.entropy[s], steering.varentropy[s]))
                for s in range(lock.step + 1)]
        assert seen[-1] == lock, "the engine's decision is the policy's decision on the engine's own trace"
    assert fired, f"{name} never ended the looping question early"


def test_a_probe_that_never_confirms_leaves_the_main_generation_untouched(chat):
    config = GravityConfig(policy={"name": "window_mean", "window": 8, "threshold": 0.6}, loop=None,
                           probe=ProbeConfig(agree=20, max_probes=3, gap=8))
    _, probed = run(chat, QUESTIONS[0], config)
    _, plain = run(chat, QUESTIONS[0], OFF)
    assert probed.token_ids == plain.token_ids, "probes are side requests: the stream is the same"
    assert len(probed.steering.probes.records) == 3 and probed.steering.probes.tokens > 0
    assert not probed.steering.terminated_early


def test_agreeing_probes_end_the_reasoning_and_say_so(chat):
    message = chat.invoke(QUESTIONS[0], gravity=GravityConfig(loop=None))
    g = message.response_metadata["gravity"]
    assert g["terminated_early"] and g["reason"] == "gravity" and g["detail"].startswith("probe(")
    assert g["probes"] >= 2 and g["trigger"]["probes"] == g["probes"] and g["probe_tokens"] > 0
    assert message.content


def test_an_excluded_task_type_never_ends_early_but_keeps_its_trace(chat):
    message = chat.invoke(QUESTIONS[0], task="legal")
    g = message.response_metadata["gravity"]
    assert not g["enabled"] and not g["terminated_early"] and g["task"] == "legal"
    assert g["reason"] == "reasoning_budget" and len(g["entropy"]) == message.usage_metadata["output_tokens"]
