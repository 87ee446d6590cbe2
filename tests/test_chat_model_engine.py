"""ChatGravity against the real embedded model on the real local vLLM CPU engine."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import TypedDict

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessageChunk, ChatMessage, HumanMessage
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from pydantic import BaseModel

from agent_gravity import (
    ChatGravity,
    ContextLengthError,
    EngineMemoryError,
    EngineTimeoutError,
    GravityConfig,
    InvalidCallOptionError,
    ModelNotFoundError,
)
from agent_gravity._steering import SteeringSpec
from agent_gravity.backends import GenerationRequest, SamplingSettings
from agent_gravity.backends.base import drain
from tests.conftest import PROVIDER

pytestmark = pytest.mark.engine

LOOPING = "If a shirt costs 20 dollars and is 25% off, what is the price?"
SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"
OFF = GravityConfig(enabled=False)


def entropy_from_logprobs(step: dict[int, float]) -> float:
    """Entropy in float64 from the engine's own full-vocabulary log-probabilities."""
    return -sum(math.exp(lp) * lp for lp in step.values() if lp > -math.inf)


def plain_request(chat: ChatGravity, text: str, max_tokens: int) -> GenerationRequest:
    backend = chat.get_backend()
    prompt = backend.render([{"role": "user", "content": text}])
    spec = SteeringSpec(key=f"trace-{text[:8]}-{max_tokens}", eos_ids=backend.eos_ids)
    return GenerationRequest(prompt, SamplingSettings(max_tokens=max_tokens, logprobs=-1), spec)


def assert_trace_is_exact(result) -> None:
    assert len(result.entropy) == len(result.token_ids) == len(result.logprobs)
    expected = [entropy_from_logprobs(step) for step in result.logprobs]
    assert result.entropy == pytest.approx(expected, abs=2e-4)


def test_entropy_trace_is_exact_against_the_engines_own_logprobs(chat):
    result = drain(chat.get_backend().stream(plain_request(chat, "Name three colours.", 10)))
    assert_trace_is_exact(result)
    assert max(result.entropy) > 0.05  # a real distribution, not a constant


def test_concurrent_requests_of_different_lengths_keep_their_own_traces(chat):
    backend = chat.get_backend()
    texts = ["Count to five.", "What is the capital of France?", "Say hello."]
    requests = [plain_request(chat, t, n) for t, n in zip(texts, (3, 9, 6))]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = drain(backend.stream(requests[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, n in enumerate((3, 9, 6)):
        assert len(results[i].token_ids) <= n
        assert_trace_is_exact(results[i])


def test_gravity_ends_converged_reasoning_early_and_the_answer_follows(chat):
    base = chat.invoke(LOOPING, gravity=OFF)
    grav = chat.invoke(LOOPING)
    g, b = grav.response_metadata["gravity"], base.response_metadata["gravity"]
    assert g["terminated_early"] and g["reason"] == "gravity"
    assert "locked at token" in g["detail"] and g["trigger"] and g["lock_step"] >= 15
    assert grav.usage_metadata["output_tokens"] < base.usage_metadata["output_tokens"]
    assert g["reasoning_tokens"] < b["reasoning_tokens"]
    assert grav.content and g["answer_tokens"] > 0 and g["answer_complete"]
    assert grav.additional_kwargs["reasoning_content"]
    assert len(g["entropy"]) == grav.usage_metadata["output_tokens"]
    assert not b["terminated_early"] and b["lock_step"] is None


def test_gravity_off_keeps_the_trace_and_uses_the_same_format(chat):
    msg = chat.invoke(SIMPLE, gravity=OFF)
    meta = msg.response_metadata["gravity"]
    assert meta["enabled"] is False and meta["reason"] in ("model_ended", "reasoning_budget")
    assert "8" in msg.content
    assert len(meta["entropy"]) == msg.usage_metadata["output_tokens"]
    usage = msg.usage_metadata
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] and usage["input_tokens"] > 20


def test_stream_gives_the_same_message_as_invoke(chat):
    whole = chat.invoke(LOOPING)
    chunks = list(chat.stream(LOOPING))
    assert all(isinstance(c, AIMessageChunk) for c in chunks) and len(chunks) > 5
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert merged.content.strip() == whole.content
    assert merged.additional_kwargs["reasoning_content"].strip() == whole.additional_kwargs["reasoning_content"]
    assert merged.usage_metadata == whole.usage_metadata
    assert merged.response_metadata["gravity"]["terminated_early"]


async def test_async_invoke_and_stream(chat):
    msg, chunks = await asyncio.gather(chat.ainvoke(SIMPLE), _collect(chat.astream(LOOPING)))
    assert msg.content and msg.response_metadata["gravity"]["entropy"]
    assert chunks[-1].response_metadata["gravity"]["reasoning_tokens"] > 0


async def _collect(aiter):
    return [c async for c in aiter]


def test_batch_runs_concurrently_on_one_engine(chat):
    questions = [SIMPLE, LOOPING, "Sara has 12 cookies and eats 4. How many are left?"]
    messages = chat.batch(questions)
    assert [bool(m.content) for m in messages] == [True, True, True]
    assert len({m.id for m in messages}) == 3


class _Broken(SpanExporter):
    """An exporter whose collector is unreachable, while ``on`` is set."""

    on = False

    def export(self, spans):
        if self.on:
            raise ConnectionError("collector unreachable")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        """Nothing to release."""


_BROKEN = _Broken()
PROVIDER.add_span_processor(SimpleSpanProcessor(_BROKEN))


def test_a_failing_exporter_never_breaks_the_call(chat, spans):
    _BROKEN.on = True
    try:
        assert chat.invoke(SIMPLE).content
    finally:
        _BROKEN.on = False
    assert [s.name for s in spans.get_finished_spans()] == ["chat SmolLM2-135M-Instruct"]


def test_a_stream_stopped_early_is_not_an_error_and_the_engine_goes_on(chat, spans):
    for _ in chat.stream(LOOPING):
        break
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "UNSET"
    assert chat.invoke(SIMPLE).content


def test_chat_models_on_the_same_model_share_one_engine(chat):
    other = ChatGravity(gravity=GravityConfig(min_tokens=5))
    assert other.get_backend() is chat.get_backend()


def test_bad_messages_get_clear_errors(chat):
    with pytest.raises(ValueError, match="message list is empty"):
        chat.invoke([])
    with pytest.raises(ValueError, match="unknown message role 'narrator'"):
        chat.invoke([ChatMessage(role="narrator", content="hi")])


def test_a_prompt_longer_than_the_context_is_refused_before_the_engine(chat):
    with pytest.raises(ContextLengthError, match="the context holds 4096"):
        chat.invoke([HumanMessage("word " * 5000)])
    assert chat.invoke(SIMPLE).content  # the engine is still healthy


def test_a_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        ChatGravity(model=str(tmp_path / "nope")).invoke("hi")


def test_a_second_engine_that_does_not_fit_is_refused(chat, monkeypatch):
    from agent_gravity.backends import local_vllm

    monkeypatch.setattr(local_vllm, "available_memory", lambda: 1 << 30)
    running = dict(local_vllm._ENGINES)
    with pytest.raises(EngineMemoryError, match="only 1.0 GiB is free"):
        ChatGravity(max_model_len=2048).invoke(SIMPLE)
    assert local_vllm._ENGINES == running


def test_plain_generation_never_cuts_and_only_observes(chat):
    msg = chat.invoke(SIMPLE, gravity=GravityConfig(reasoning=None, max_answer_tokens=40))
    meta = msg.response_metadata["gravity"]
    assert msg.content and "reasoning_content" not in msg.additional_kwargs
    assert not meta["terminated_early"] and meta["reason"] is None and meta["reasoning_tokens"] == 0
    assert meta["answer_tokens"] == msg.usage_metadata["output_tokens"] <= 40


def test_langchain_standard_parameters_do_what_they_say(chat):
    capped = ChatGravity(max_tokens=12).invoke(LOOPING, gravity=OFF)
    assert capped.usage_metadata["output_tokens"] == 12
    assert not capped.response_metadata["gravity"]["answer_complete"], "a cut answer says so"
    streamed = ChatGravity(streaming=True).invoke(SIMPLE)
    assert streamed.content.strip() == chat.invoke(SIMPLE).content and streamed.usage_metadata["output_tokens"] > 0
    with pytest.raises(EngineTimeoutError, match="timeout"):
        chat.invoke(LOOPING, gravity=OFF, timeout=0.05)
    assert chat.invoke(SIMPLE).content, "the engine goes on after a timed-out call"


class Person(BaseModel):
    name: str
    age: int


class PersonDict(TypedDict):
    name: str
    age: int


def test_structured_output_is_held_to_the_schema_by_the_engine_and_never_cut(chat):
    person = chat.with_structured_output(Person).invoke("Bob is 40 years old. Give his name and age.")
    assert isinstance(person, Person) and person.age == 40
    raw = chat.with_structured_output(PersonDict, include_raw=True).invoke("Bob is 40. Give his name and age.")
    assert raw["parsing_error"] is None and set(raw["parsed"]) == {"name", "age"}
    g = raw["raw"].response_metadata["gravity"]
    assert not g["enabled"] and not g["terminated_early"] and g["reasoning_tokens"] == 0
    colour = {"title": "Colour", "type": "object", "required": ["colour"],
              "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}}}
    assert chat.with_structured_output(colour).invoke("What colour is the sky?")["colour"] in ("red", "blue")


def test_a_structured_output_cut_by_the_budget_is_refused_not_closed_by_the_parser(chat):
    short = ChatGravity(backend=chat.get_backend(), max_tokens=3)
    with pytest.raises(OutputParserException, match="cut by the token budget after 3 tokens"):
        short.with_structured_output(Person).invoke("Bob is 40. Give his name and age.")
    raw = short.with_structured_output(PersonDict, include_raw=True).invoke("Bob is 40. Give his name and age.")
    assert raw["parsed"] is None and isinstance(raw["parsing_error"], OutputParserException)
    assert raw["raw"].response_metadata["finish_reason"] == "length"
    with pytest.raises(OutputParserException, match="cut by the token budget"):  # partial values, then the refusal
        list(short.with_structured_output(PersonDict).stream("Bob is 40. Give his name and age."))
    streamed = list(chat.with_structured_output(PersonDict).stream("Bob is 40. Give his name and age."))
    assert len(streamed) > 1 and set(streamed[-1]) == {"name", "age"}, "a whole output still streams partial values"


def test_a_schema_that_is_not_one_is_a_clear_error(chat):
    with pytest.raises(InvalidCallOptionError, match="cannot use .* as a structured-output schema"):
        chat.with_structured_output(42)
