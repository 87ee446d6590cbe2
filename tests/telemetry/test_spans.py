"""Spans on the real engine: names, kinds, nesting, GenAI and gravity attributes, events, content opt-in, modes."""

from __future__ import annotations

import json
import random

import pytest
from langchain_core.messages import HumanMessage
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from agent_gravity import ChatGravity, GravityConfig, TelemetryConfig

pytestmark = pytest.mark.engine

LOOPING = "If a shirt costs 20 dollars and is 25% off, what is the price?"
SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"
LOOP_ONLY = GravityConfig(policy=None, probe=None, loop={"name": "loop"})


def chat_spans(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("chat ")]


def events(span) -> list[tuple[str, dict]]:
    return [(e.name, dict(e.attributes)) for e in span.events]


def test_a_chat_span_has_genai_and_gravity_attributes_events_and_no_text_by_default(chat, spans):
    msg = chat.invoke(LOOPING, conversation_id="conv-7")
    (span,) = chat_spans(spans)
    a, g = span.attributes, msg.response_metadata["gravity"]
    assert span.name == "chat SmolLM2-135M-Instruct" and span.kind is SpanKind.CLIENT and span.parent is None
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "vllm"
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == "SmolLM2-135M-Instruct"
    assert a["gen_ai.request.temperature"] == 0.0 and a["gen_ai.request.max_tokens"] > 0
    assert a["gen_ai.usage.input_tokens"] == msg.usage_metadata["input_tokens"]
    assert a["gen_ai.usage.output_tokens"] == msg.usage_metadata["output_tokens"]
    assert a["gen_ai.response.finish_reasons"] == ("stop",) and a["gen_ai.response.id"] == msg.id
    assert a["gen_ai.conversation.id"] == "conv-7"
    assert 0 < a["gen_ai.response.time_to_first_chunk"] < (span.end_time - span.start_time) / 1e9
    assert a["agent_gravity.terminated_early"] is True and a["agent_gravity.reason"] == "gravity"
    assert a["agent_gravity.lock_step"] == g["lock_step"] and a["agent_gravity.probes"] == g["probes"] > 0
    assert a["agent_gravity.reasoning_tokens"] == g["reasoning_tokens"]
    assert a["agent_gravity.answer_tokens"] == g["answer_tokens"]
    assert 0 <= a["agent_gravity.entropy.min"] <= a["agent_gravity.entropy.mean"] <= a["agent_gravity.entropy.max"]
    names = [n for n, _ in events(span)]
    assert names == ["agent_gravity.lock", "agent_gravity.exit"], names
    lock, exit_ = (e for _, e in events(span))
    assert lock["agent_gravity.step"] == g["lock"]["step"] and lock["agent_gravity.policy"] == g["lock"]["policy"]
    assert {k.removeprefix("agent_gravity.value.") for k in lock if ".value." in k} == set(g["lock"]["values"])
    assert exit_["agent_gravity.step"] == g["reasoning_tokens"] and exit_["agent_gravity.reason"] == "gravity"
    assert exit_["agent_gravity.terminated_early"] is True
    recorded = " ".join(v for v in a.values() if isinstance(v, str))
    for text in (LOOPING, "shirt", msg.additional_kwargs["reasoning_content"][:20], msg.content[:20]):
        assert len(text) < 5 or text not in recorded  # a one-digit answer may occur in an id
    assert not [k for k in a if k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.prompt"))]


def test_a_stopped_loop_is_an_event_with_the_values_behind_it(chat, spans):
    msg = chat.invoke(LOOPING, gravity=LOOP_ONLY)
    g = msg.response_metadata["gravity"]
    assert g["reason"] == "loop"
    (span,) = chat_spans(spans)
    (stop,) = [e for n, e in events(span) if n == "agent_gravity.loop_stop"]
    lock = g["lock"] if g["lock"] and g["lock"]["reason"] == "loop" else g["loop_stop"]
    assert stop["agent_gravity.step"] == lock["step"] and stop["agent_gravity.value.period"] == lock["values"]["period"]
    assert "agent_gravity.lock" not in [n for n, _ in events(span)], "a loop is not a gravity lock"


def test_message_content_is_recorded_only_when_the_user_opts_in(chat, spans, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    opted_in = ChatGravity(backend=chat.get_backend())
    msg = opted_in.invoke([HumanMessage(SIMPLE)])
    (span,) = chat_spans(spans)
    sent = json.loads(span.attributes["gen_ai.input.messages"])
    assert sent == [{"role": "user", "parts": [{"type": "text", "content": SIMPLE}]}]
    (out,) = json.loads(span.attributes["gen_ai.output.messages"])
    assert out["role"] == "assistant" and out["finish_reason"] == "stop"
    assert {"type": "text", "content": msg.content} in out["parts"]
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "maybe")
    with pytest.raises(ValueError, match="CAPTURE_MESSAGE_CONTENT='maybe' is not understood"):
        ChatGravity(backend=chat.get_backend())


def test_enrich_puts_our_attributes_on_the_callers_span_and_off_records_no_span(chat, spans):
    backend = chat.get_backend()
    with trace.get_tracer("an instrumentor").start_as_current_span("ChatGravity.invoke"):
        msg = ChatGravity(backend=backend, telemetry=TelemetryConfig(spans="enrich")).invoke(SIMPLE)
    (only,) = spans.get_finished_spans()
    assert only.name == "ChatGravity.invoke", "no span of ours next to the instrumentor's"
    assert only.attributes["gen_ai.usage.output_tokens"] == msg.usage_metadata["output_tokens"]
    assert only.attributes["agent_gravity.reasoning_tokens"] == msg.response_metadata["gravity"]["reasoning_tokens"]
    spans.clear()
    assert ChatGravity(backend=backend, telemetry=TelemetryConfig(spans="off")).invoke(SIMPLE).content
    assert spans.get_finished_spans() == ()


def test_an_agent_run_nests_its_chat_and_tool_spans_under_the_callers_span(adder_agent, spans):
    with trace.get_tracer("app").start_as_current_span("request") as outer:
        adder_agent(SIMPLE)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    run, model = by_name["invoke_agent adder"], by_name["chat SmolLM2-135M-Instruct"]
    tool_ = by_name["execute_tool add"]
    assert run.parent.span_id == outer.get_span_context().span_id
    assert model.parent.span_id == run.context.span_id == tool_.parent.span_id
    assert run.attributes["gen_ai.agent.name"] == "adder" and run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert tool_.attributes["gen_ai.tool.name"] == "add" and tool_.attributes["gen_ai.tool.call.id"] == "call-1"
    assert tool_.attributes["gen_ai.operation.name"] == "execute_tool"
    assert len({s.context.trace_id for s in (run, model, tool_)}) == 1



def test_starting_the_engine_gives_the_process_its_random_state_back(monkeypatch):
    """vLLM seeds Python's global RNG as it starts, and span ids are drawn from it: every run would repeat the same
    ids, and a dashboard keeps only the first span of each."""
    import vllm

    from agent_gravity.backends.local_vllm import EngineSettings, _start_engine

    monkeypatch.setattr(vllm, "LLM", lambda **kw: random.seed(kw["seed"]))
    before = random.getstate()
    _start_engine(EngineSettings(model_dir="/nonexistent"))
    assert random.getstate() == before
