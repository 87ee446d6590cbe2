"""One suite over every Backend: the same trace, the same gravity behaviour, the same contract."""

from __future__ import annotations

import asyncio
import math

import pytest
from agent_gravity.backends import Backend, GenerationRequest, SamplingSettings
from agent_gravity.backends.base import GenerationDelta, GenerationResult, adrain, drain

from agent_gravity import ChatGravity, EngineTimeoutError, GravityConfig
from agent_gravity._steering import SteeringSpec

SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"
WINDOW = GravityConfig(policy={"name": "window_mean", "window": 6, "threshold": 0.8, "patience": 1}, probe=None)


@pytest.fixture(scope="module", params=["vllm", "transformers"])
def backend(request) -> Backend:
    if request.param == "vllm":
        return request.getfixturevalue("chat").get_backend()
    return request.getfixturevalue("transformers_backend")


def request_for(backend: Backend, text: str, max_tokens: int, **sampling) -> GenerationRequest:
    prompt = backend.render([{"role": "user", "content": text}])
    spec = SteeringSpec(key=f"conf-{backend.provider}-{text[:6]}-{max_tokens}", eos_ids=backend.eos_ids)
    return GenerationRequest(prompt, SamplingSettings(max_tokens=max_tokens, **sampling), spec)


def entropy_from_logprobs(step: dict[int, float]) -> float:
    return -sum(math.exp(lp) * lp for lp in step.values() if lp > -math.inf)


def test_it_is_a_backend(backend):
    assert isinstance(backend, Backend) and backend.eos_ids and backend.max_context > 0
    assert len(backend.token_texts) >= max(backend.eos_ids) and backend.decode(backend.encode("hello")) == "hello"


def test_the_entropy_trace_is_exact_against_its_own_full_vocabulary_logprobs(backend):
    result = drain(backend.stream(request_for(backend, "Name three colours.", 10, logprobs=-1)))
    assert len(result.entropy) == len(result.token_ids) == len(result.logprobs) == 10
    assert result.entropy == pytest.approx([entropy_from_logprobs(s) for s in result.logprobs], abs=2e-4)
    assert max(result.entropy) > 0.05


def test_deltas_add_up_to_the_result_and_stream_and_astream_agree(backend):
    items = list(backend.stream(request_for(backend, "Count to five.", 12)))
    deltas, result = items[:-1], items[-1]
    assert isinstance(result, GenerationResult) and all(isinstance(d, GenerationDelta) for d in deltas)
    assert [i for d in deltas for i in d.token_ids] == result.token_ids
    assert "".join(d.text for d in deltas) == result.text
    assert [e for d in deltas for e in d.entropy] == result.entropy
    again = asyncio.run(adrain(backend.astream(request_for(backend, "Count to five.", 12))))
    assert again.token_ids == result.token_ids and result.finish_reason == "length"


def test_stop_strings_end_the_output_before_them(backend):
    result = drain(backend.stream(request_for(backend, "Count from 1 to 10, comma separated.", 40, stop=("4",))))
    assert result.finish_reason == "stop" and "4" not in result.text and result.text


def test_a_timeout_aborts_the_request(backend):
    req = request_for(backend, "Write a long story.", 400)
    with pytest.raises(EngineTimeoutError):
        drain(backend.stream(GenerationRequest(req.prompt_ids, req.sampling, req.steering, timeout=0.05)))


def test_gravity_exits_the_same_way(backend):
    for config in (WINDOW, GravityConfig(enabled=False)):
        reply = ChatGravity(backend=backend, gravity=config).invoke(SIMPLE)
        gravity = reply.response_metadata["gravity"]
        assert reply.content and gravity["reasoning_tokens"] > 0 and len(gravity["entropy"]) > 0
        assert gravity["terminated_early"] == (config is WINDOW and gravity["reason"] == "gravity")


def test_both_backends_give_the_same_tokens_and_trace(chat, transformers_backend):
    results = [drain(b.stream(request_for(b, "Name three colours.", 16)))
               for b in (chat.get_backend(), transformers_backend)]
    assert results[0].token_ids == results[1].token_ids
    assert results[0].entropy == pytest.approx(results[1].entropy, abs=2e-3)
    replies = [ChatGravity(backend=b, gravity=WINDOW).invoke(SIMPLE).response_metadata["gravity"]
               for b in (chat.get_backend(), transformers_backend)]
    assert [(r["reason"], r["reasoning_tokens"], r["lock_step"]) for r in replies].count(
        (replies[0]["reason"], replies[0]["reasoning_tokens"], replies[0]["lock_step"])) == 2
