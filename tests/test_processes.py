"""Child servers: a recorded pid is only signalled while it is still the process that was started."""

import json
import os
import subprocess
import sys

import pytest

from agent_gravity._cli import main
from agent_gravity._processes import free_port, is_running, started_at, stop_group
from agent_gravity.telemetry._export import dashboard_file, running_dashboard


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    dashboard_file().parent.mkdir(parents=True)


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_dashboard_stop_leaves_alone_a_pid_that_another_process_has_now(config_home, capsys):
    # The record names a live process (this test's own) but another start time: a reused pid.
    dashboard_file().write_text(json.dumps({"pid": os.getpid(), "started": started_at(os.getpid()) - 3600,
                                            "url": "http://127.0.0.1:9"}))
    assert running_dashboard() is None
    assert main(["dashboard", "--stop"]) == 2  # this process is still here to see it
    assert "is not signalled" in capsys.readouterr().err and not dashboard_file().exists()


def test_dashboard_stop_stops_the_process_it_started(config_home):
    child = _child()
    try:
        dashboard_file().write_text(json.dumps({"pid": child.pid, "started": started_at(child.pid),
                                                "url": "http://127.0.0.1:9"}))
        assert running_dashboard() is not None
        assert main(["dashboard", "--stop"]) == 0
        assert child.poll() is not None and not dashboard_file().exists()
    finally:
        child.kill()


def test_stop_group_escalates_to_sigkill_and_reaps():
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                             start_new_session=True, stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"ready"
    started = started_at(child.pid)
    stop_group(child.pid, grace=0.5)
    assert not is_running(child.pid, started)
    stop_group(child.pid, grace=0.5)  # gone already: nothing to do


def test_free_port_can_be_bound():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
