"""The project's OTLP exporter: spans (and metrics) to a collector or the local dashboard, in the background.

Export runs on the SDK's batch processors' own threads with a short timeout, so a collector that is
down or hangs never slows or breaks a model call.
"""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator

from agent_gravity import __version__
from agent_gravity._processes import is_running

_log = logging.getLogger(__name__)
ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def dashboard_file() -> Path:
    """Where ``agent-gravity dashboard`` records the endpoint of the dashboard it runs."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "agent-gravity" / "dashboard.json"


def running_dashboard() -> dict[str, Any] | None:
    """The dashboard ``agent-gravity dashboard`` started, when that very process (pid and start time) still runs."""
    try:
        info = json.loads(dashboard_file().read_text())
        alive = is_running(int(info["pid"]), float(info["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if alive else None


def setup_tracing(endpoint: str | None = None, *, metrics_export: bool | None = None,
                  timeout: float = 5.0, service_name: str = "agent-gravity") -> TracerProvider | None:
    """Export spans (and metrics) over OTLP/HTTP to ``endpoint`` (a base URL such as ``http://127.0.0.1:4318``).

    Without ``endpoint``: the standard ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` variables, else the dashboard
    that ``agent-gravity dashboard`` runs; None (and nothing set up) when there is none. An application's own
    SDK TracerProvider is kept and gets the exporter added; otherwise one is installed. Metrics go to the same
    collector unless ``metrics_export`` is False (the Phoenix dashboard takes spans only).
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    dashboard = None if endpoint or any(os.environ.get(e) for e in ENDPOINT_ENVS) else running_dashboard()
    if dashboard is not None:
        endpoint = dashboard["endpoint"]
        metrics_export = bool(dashboard.get("metrics")) if metrics_export is None else metrics_export
    elif endpoint is None and not any(os.environ.get(e) for e in ENDPOINT_ENVS):
        return None
    base = endpoint.rstrip("/") if endpoint else None
    exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces" if base else None, timeout=timeout)
    provider = _provider(service_name)
    provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=int(timeout * 1000)))
    if metrics_export is not False:
        _export_metrics(base, timeout, service_name)
    return provider


class SystemRandomIdGenerator(IdGenerator):
    """Trace and span ids from the OS's randomness: libraries that seed Python's global RNG (vLLM does, as it
    starts) cannot make two runs repeat each other's ids."""

    _random = random.SystemRandom()

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


def _provider(service_name: str) -> TracerProvider:
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider(resource=Resource.create({"service.name": service_name,
                                                        "service.version": __version__}),
                              id_generator=SystemRandomIdGenerator())
    trace.set_tracer_provider(provider)
    return provider


def _export_metrics(base: str | None, timeout: float, service_name: str) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if isinstance(metrics.get_meter_provider(), MeterProvider):
        _log.info("a MeterProvider is already set: agent-gravity's metrics go wherever it exports")
        return
    exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics" if base else None, timeout=timeout)
    reader = PeriodicExportingMetricReader(exporter, export_timeout_millis=int(timeout * 1000))
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader], resource=Resource.create(
        {"service.name": service_name, "service.version": __version__})))
