"""Surface: ``agent-gravity dashboard``, an Arize Phoenix server on loopback that our OTLP exporter points at.

Phoenix runs as its own process, from the Python that has it: ``$AGENT_GRAVITY_PHOENIX_PYTHON``, else
this one (the ``dashboard`` extra), else the ``.venv-dashboard`` beside this virtual environment (what
``make dashboard-env`` builds, since Phoenix's pins clash with vLLM's CPU build). The server's endpoint is
recorded where ``setup_tracing()`` finds it, so an agent started afterwards exports its spans there.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from agent_gravity._errors import DashboardError
from agent_gravity._processes import free_port, started_at, stop_group
from agent_gravity.telemetry._export import dashboard_file, running_dashboard

HOST = "127.0.0.1"
PHOENIX_PYTHON_ENV = "AGENT_GRAVITY_PHOENIX_PYTHON"


@dataclass(frozen=True)
class Dashboard:
    """A running Phoenix server."""

    pid: int
    started: float
    """When the process started: with the pid, what tells it from a later process given the same pid."""
    url: str
    endpoint: str
    """The OTLP/HTTP base URL spans go to (``{endpoint}/v1/traces``)."""
    workdir: str
    log: str
    metrics: bool = False
    """Phoenix takes spans only: the project's exporter sends it no metrics."""


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no listener
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def phoenix_python() -> str:
    """The Python interpreter that runs Phoenix."""
    chosen = os.environ.get(PHOENIX_PYTHON_ENV)
    if chosen:
        if not Path(chosen).is_file():
            raise DashboardError(f"{PHOENIX_PYTHON_ENV}={chosen} is not a Python interpreter; point it at the "
                                 "python of an environment with arize-phoenix installed")
        return chosen
    try:
        importlib.metadata.version("arize-phoenix")
        return sys.executable
    except importlib.metadata.PackageNotFoundError:
        pass
    beside = Path(sys.prefix).parent / ".venv-dashboard" / "bin" / "python"
    if beside.is_file():
        return str(beside)
    raise DashboardError("Arize Phoenix is not installed: run make dashboard-env (it builds .venv-dashboard), or "
                         "pip install 'agent-gravity[dashboard]' where vLLM's CPU build is not installed, or set "
                         f"{PHOENIX_PYTHON_ENV} to the python of an environment that has arize-phoenix")


def start_dashboard(workdir: Path, port: int = 6006, timeout: float = 180.0) -> Dashboard:
    """Start Phoenix on ``HOST:port`` with its database under ``workdir``; return once it answers."""
    python = phoenix_python()
    if not _free(port):
        raise DashboardError(f"port {port} on {HOST} is in use; pass another --port")
    workdir = workdir.expanduser().resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "phoenix.log"
    env = {**os.environ, "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_HOST": HOST, "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(free_port(HOST)), "PHOENIX_TELEMETRY_ENABLED": "false"}
    with log.open("ab") as out:
        proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout
    while not _ready(url):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise DashboardError(f"Phoenix exited with status {proc.returncode} while starting; its log "
                                 f"({log}) ends:\n{tail}")
        if time.monotonic() > deadline:
            stop_dashboard(proc.pid)
            raise DashboardError(f"Phoenix did not answer on {url} within {timeout:.0f} s; see {log}")
        time.sleep(0.5)
    return Dashboard(proc.pid, started_at(proc.pid), url, url, str(workdir), str(log))


def stop_dashboard(pid: int, grace: float = 15.0) -> None:
    """Stop the Phoenix server ``pid`` (and its children): SIGTERM, then SIGKILL after ``grace`` seconds."""
    stop_group(pid, grace)


def run_dashboard(workdir: Path, port: int, detach: bool = False, stop: bool = False) -> int:
    """The ``agent-gravity dashboard`` command."""
    if stop:
        info = running_dashboard()
        if info is None:  # never started, gone, or its pid belongs to another program now: nothing to signal
            dashboard_file().unlink(missing_ok=True)
            raise DashboardError("no dashboard started by agent-gravity is running (a recorded process that ended, "
                                 "or whose pid another program has now, is not signalled)")
        stop_dashboard(int(info["pid"]))
        dashboard_file().unlink(missing_ok=True)
        print(f"stopped the dashboard at {info['url']}")
        return 0
    if running_dashboard() is not None:
        raise DashboardError(f"a dashboard is already running at {running_dashboard()['url']}; "
                             "stop it with agent-gravity dashboard --stop")
    dash = start_dashboard(workdir, port)
    path = dashboard_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(dash)))
    print(f"Phoenix dashboard: {dash.url}\nsetup_tracing() now exports spans to {dash.endpoint}/v1/traces "
          f"(pid {dash.pid}, data in {dash.workdir})", flush=True)
    if detach:
        return 0
    try:
        os.waitpid(dash.pid, 0)
    except KeyboardInterrupt:
        stop_dashboard(dash.pid)
    finally:
        path.unlink(missing_ok=True)
    return 0
