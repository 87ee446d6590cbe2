"""Session-wide fixtures: one in-memory span exporter, one real engine for the whole run."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SPANS = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(PROVIDER)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    """The spans finished during one test."""
    SPANS.clear()
    return SPANS


@pytest.fixture(scope="session")
def chat():
    """ChatGravity on the embedded model and the real local vLLM engine, started once per run."""
    pytest.importorskip("vllm", reason="the vLLM extra is not installed")
    from agent_gravity import ChatGravity

    model = ChatGravity()
    model.get_backend()
    return model
