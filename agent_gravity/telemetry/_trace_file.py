"""Entropy traces: each call's per-token entropy and gravity decisions, one JSON line per call, for
``agent-gravity report``. Never any prompt or completion text."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from agent_gravity.telemetry._metrics import kv_bytes_freed

ZONE = {"threshold": 1.0, "window": 10}
"""The gravity zone a report shades when the call's policy names none: the concept's 1 nat over 10 tokens."""
_ACTIVE: ContextVar[Path | None] = ContextVar("agent_gravity_trace_file", default=None)
_WRITE = threading.Lock()
_log = logging.getLogger(__name__)


@contextmanager
def entropy_trace(path: str | Path) -> Iterator[Path]:
    """Append the entropy trace of every model call made inside the block (an agent run) to ``path``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.open("a").close()
    except OSError as exc:
        raise OSError(f"cannot write the entropy trace file {path}: {exc.strerror}; choose a writable path") from exc
    token = _ACTIVE.set(path)
    try:
        yield path
    finally:
        _ACTIVE.reset(token)


def trace_path(configured: Path | None) -> Path | None:
    """Where this call's trace goes: the enclosing ``entropy_trace`` block's file, else the configured one."""
    return _ACTIVE.get() or configured


def zone_of(policy: dict[str, Any] | None) -> dict[str, float]:
    """The windowed-mean threshold a call's policy locks on (searched through combinators), else ``ZONE``."""
    if policy is None:
        return dict(ZONE)
    if policy.get("name") == "window_mean":
        return {"threshold": float(policy.get("threshold", ZONE["threshold"])),
                "window": int(policy.get("window", ZONE["window"]))}
    found = [zone_of(p) for p in policy.get("policies", ())]
    return next((z for z in found if z != ZONE), dict(ZONE))


def trace_record(header: dict[str, Any], gravity: dict[str, Any]) -> dict[str, Any]:
    """One call's line: ``header`` (model, response id, conversation, task, zone) and what gravity did."""
    keys = ("entropy", "reason", "terminated_early", "exit", "lock", "loop_stop", "reasoning_tokens",
            "answer_tokens", "tokens_saved_upper_bound", "probe_steps", "answer_complete")
    record = {"time": time.time(), **header, **{k: gravity.get(k) for k in keys},
              "kv_bytes_freed": kv_bytes_freed(gravity)}
    record["entropy"] = [e if math.isfinite(e) else None for e in record["entropy"]]  # JSON has no NaN
    return record


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Append one line; a trace file that cannot be written is logged, never raised into the model call."""
    line = json.dumps(record) + "\n"
    try:
        with _WRITE, path.open("a", encoding="utf-8") as f:
            f.write(line)
    except OSError:
        _log.warning("could not append to the entropy trace file %s", path, exc_info=True)
