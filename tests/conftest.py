"""Session-wide fixtures: one in-memory span exporter and metric reader, one real engine for the whole run."""

from __future__ import annotations

import os
import tempfile

# The Triton kernels are tested on the CPU in Triton's interpreter; it must be on before triton
# decorates them. The engine does not notice: on the CPU it uses the torch reference.
os.environ.setdefault("TRITON_INTERPRET", "1")
# Calibrated profiles in the user's cache must not change what the tests see.
os.environ["AGENT_GRAVITY_PROFILES"] = tempfile.mkdtemp(prefix="agent-gravity-profiles-")

import pytest  # noqa: E402
from opentelemetry import metrics, trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

SPANS = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(PROVIDER)
METRICS = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[METRICS]))


def metric_points(name: str) -> dict[frozenset, float]:
    """Cumulative value of each data point of metric ``name`` (a histogram's sum, a counter's value), keyed by
    its attributes."""
    data = METRICS.get_metrics_data()
    out: dict[frozenset, float] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        out[frozenset(point.attributes.items())] = getattr(point, "sum", getattr(point, "value", 0))
    return out


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


@pytest.fixture(scope="session")
def transformers_backend():
    """The embedded model on the transformers backend, loaded once per run."""
    from agent_gravity import _model_store
    from agent_gravity.backends.local_transformers import TransformersBackend, TransformersSettings

    return TransformersBackend(TransformersSettings(str(_model_store.pull())), _model_store.DEFAULT_MODEL.name)


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    """Three vLLM OpenAI servers on loopback for the embedded model: two with our plugin, one without.

    They start together (in parallel) on first use and stop when the run ends.
    """
    pytest.importorskip("vllm", reason="the vLLM extra is not installed")
    from agent_gravity import _model_store
    from agent_gravity.bench.vllm_servers import ServerSpec, servers

    folder, name = str(_model_store.pull()), _model_store.DEFAULT_MODEL.name
    specs = [ServerSpec(folder, name), ServerSpec(folder, name), ServerSpec(folder, name, plugin=False)]
    with servers(specs, tmp_path_factory.mktemp("vllm-logs")) as running:
        yield {"plugin": running[0].url, "plugin_b": running[1].url, "plain": running[2].url}
