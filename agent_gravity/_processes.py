"""Servers this package starts as child processes (vLLM, Phoenix): a free port, who a recorded pid is, stopping.

A pid written to a file outlives its process, and the system hands it to another program later; signalling
it then would stop that program. A recorded process is therefore kept with its start time, and only a process
with the same pid *and* start time counts as the one that was started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def started_at(pid: int) -> float:
    """When process ``pid`` started (seconds since the epoch); ProcessLookupError if there is none."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess as exc:
        raise ProcessLookupError(pid) from exc


def is_running(pid: int, started: float) -> bool:
    """Whether ``pid`` is still the process that started at ``started``, and not a zombie."""
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.01 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_group(pid: int, grace: float) -> None:
    """Stop process ``pid`` and its process group: SIGTERM, then SIGKILL after ``grace`` seconds; reap it if it is
    our child. Nothing happens to a group that is gone already."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            os.kill(pid, 0)  # raises ProcessLookupError once it is gone
            time.sleep(0.2)
        os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
