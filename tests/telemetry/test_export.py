"""The project's OTLP exporter: a collector that is down or hangs never slows or breaks a model call."""

from __future__ import annotations

import socket
import threading

import pytest
from opentelemetry import trace

from agent_gravity import setup_tracing
from agent_gravity.telemetry._export import dashboard_file, running_dashboard
from tests.conftest import PROVIDER

SIMPLE = "Tom has 3 apples and buys 5 more. How many apples does he have?"


@pytest.fixture
def no_endpoint(monkeypatch, tmp_path):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))


def test_without_an_endpoint_nothing_is_set_up_and_a_dead_dashboard_is_ignored(no_endpoint):
    assert setup_tracing() is None
    dashboard_file().parent.mkdir(parents=True)
    dashboard_file().write_text('{"pid": 999999999, "endpoint": "http://127.0.0.1:9"}')
    assert running_dashboard() is None and setup_tracing() is None


class _Hanging:
    """A collector that accepts connections and never answers, until released."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = threading.Event()
        self.release = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self.release.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def waiting(self) -> bool:
        """A client sent its request and still waits on the open connection (it has not given up)."""
        conn, received = self.conns[0], b""
        conn.setblocking(False)
        while True:
            try:
                chunk = conn.recv(1 << 20)
            except BlockingIOError:  # nothing more to read, and not closed
                return received.startswith(b"POST /v1/traces")
            if not chunk:  # the client closed the connection: it gave up
                return False
            received += chunk

    def close(self) -> None:
        self.release.set()
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.engine
def test_an_unreachable_or_hanging_collector_never_slows_or_breaks_a_call(chat, spans, no_endpoint):
    closed = socket.create_server(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()  # nothing listens there now
    hanging = _Hanging()
    try:
        assert setup_tracing(dead, metrics_export=False, timeout=2) is PROVIDER, "the app's provider is kept"
        assert setup_tracing(hanging.url, metrics_export=False, timeout=30) is PROVIDER
        with trace.get_tracer("app").start_as_current_span("request"):
            assert chat.invoke(SIMPLE).content
        PROVIDER.force_flush(timeout_millis=100)  # hand the spans to the exporters' threads
        assert hanging.accepted.wait(10), "the spans went to the hanging collector"
        # Another call goes through while that export still waits for its answer (its request is in, its
        # connection open): export runs on the processor's own thread.
        assert chat.invoke(SIMPLE).content
        assert [s.name for s in spans.get_finished_spans()][-1] == "chat SmolLM2-135M-Instruct"
        assert hanging.waiting(), "the export was still hanging when the call returned"
    finally:
        hanging.close()


def test_trace_headers_carry_the_active_spans_traceparent_for_a_remote_vllm(spans):
    from agent_gravity.telemetry import trace_headers

    with trace.get_tracer("app").start_as_current_span("chat") as span:
        headers = trace_headers()
    ctx = span.get_span_context()
    assert headers["traceparent"] == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    assert trace_headers() == {}, "no active span: nothing to propagate"
