"""A real Phoenix dashboard on loopback: an agent's spans read back through Phoenix's REST API."""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest

from agent_gravity import setup_tracing
from agent_gravity._cli import main
from agent_gravity._dashboard import phoenix_python
from agent_gravity._errors import DashboardError
from agent_gravity._processes import free_port
from agent_gravity.telemetry._export import running_dashboard
from tests.conftest import PROVIDER
from tests.telemetry.conftest import SIMPLE


def _has_phoenix() -> bool:
    try:
        phoenix_python()
    except DashboardError:
        return False
    return True


pytestmark = [pytest.mark.engine,
              pytest.mark.skipif(not _has_phoenix(), reason="Arize Phoenix is not installed (make test builds "
                                 ".venv-dashboard with it)")]



def _spans(url: str, expected: int, timeout: float = 60) -> list[dict]:
    """The default project's spans, once Phoenix has ingested ``expected`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(f"{url}/v1/projects/default/spans?limit=100", timeout=10) as r:
            spans = json.loads(r.read())["data"]
        if len(spans) >= expected or time.monotonic() > deadline:
            return spans
        PROVIDER.force_flush(timeout_millis=2000)
        time.sleep(1)


def test_an_agent_runs_spans_reach_a_real_phoenix_nested_and_with_their_attributes(adder_agent, tmp_path,
                                                                                    monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    assert main(["dashboard", "--detach", "--workdir", str(tmp_path / "phoenix"), "--port", str(port)]) == 0
    info = running_dashboard()
    try:
        url = f"http://127.0.0.1:{port}"
        assert url in capsys.readouterr().out and info["url"] == url
        assert setup_tracing() is PROVIDER, "setup_tracing() finds the dashboard by itself"

        adder_agent(SIMPLE)
        PROVIDER.force_flush(timeout_millis=10_000)
        spans = {s["name"]: s for s in _spans(url, 3)}
        run, model, used = spans["invoke_agent adder"], spans["chat SmolLM2-135M-Instruct"], spans["execute_tool add"]
        assert run["parent_id"] is None
        assert model["parent_id"] == run["context"]["span_id"] == used["parent_id"]
        assert len({s["context"]["trace_id"] for s in (run, model, used)}) == 1
        a = model["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
        assert a["gen_ai.usage.output_tokens"] > 0 and a["agent_gravity.reasoning_tokens"] >= 0
        assert "agent_gravity.entropy.mean" in a and used["attributes"]["gen_ai.tool.name"] == "add"
        # Phoenix reads the GenAI conventions into its own span kinds and token counts
        assert (run["span_kind"], model["span_kind"], used["span_kind"]) == ("AGENT", "LLM", "TOOL")
        assert a["llm.token_count.total"] == a["gen_ai.usage.input_tokens"] + a["gen_ai.usage.output_tokens"]
    finally:
        assert main(["dashboard", "--stop"]) == 0
    with pytest.raises(ProcessLookupError):
        os.kill(info["pid"], 0)
