"""Telemetry: OpenTelemetry GenAI spans, events and metrics for every call, and entropy trace files.

Spans go wherever the application's TracerProvider sends them; ``setup_tracing()`` installs the
project's own OTLP exporter (to a collector, or to ``agent-gravity dashboard``).
"""

from agent_gravity._config import TelemetryConfig
from agent_gravity.telemetry._export import setup_tracing
from agent_gravity.telemetry._spans import GRAVITY_PREFIX, trace_headers
from agent_gravity.telemetry._trace_file import entropy_trace

__all__ = ["GRAVITY_PREFIX", "TelemetryConfig", "entropy_trace", "setup_tracing", "trace_headers"]
