"""Span events: where gravity locked, where reasoning ended, where a loop was stopped, what a KV trim freed,
what the zone actions did (drafts kept, KV packed, layers skipped, top-2 steps).

Pure functions of a call's ``response_metadata["gravity"]``; each event carries the step (the output
token it happened at) and the values behind the decision.
"""

from __future__ import annotations

from typing import Any

from agent_gravity.telemetry._spans import GRAVITY_PREFIX

LOCK, EXIT, LOOP_STOP, KV_TRIM = (GRAVITY_PREFIX + n for n in ("lock", "exit", "loop_stop", "kv_trim"))
COMPUTE_EVENTS = {"speculation": ("drafted", "accepted", "passes"), "kv": ("entries", "bits", "bytes_held", "bytes_full"),
                  "skip": ("steps", "layer_passes_saved"), "top2": ("steps",)}
"""Zone actions that become span events (``gravity.<action>``) when they acted (the first figure is not 0), and the
figures each carries."""


def _lock_event(lock: dict[str, Any]) -> dict[str, Any]:
    values = {f"{GRAVITY_PREFIX}value.{k}": float(v) for k, v in lock["values"].items()}
    return {GRAVITY_PREFIX + "step": lock["step"], GRAVITY_PREFIX + "policy": lock["policy"], **values}


def gravity_events(gravity: dict[str, Any], output_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    """The events of one finished call, in the order they happened."""
    events: list[tuple[str, dict[str, Any]]] = []
    locks = [gravity["lock"], gravity["loop_stop"]]
    for lock in [x for i, x in enumerate(locks) if x and x not in locks[:i]]:  # a loop lock: in reasoning or answer
        events.append((LOOP_STOP if lock["reason"] == "loop" else LOCK, _lock_event(lock)))
    if gravity["exit"]:  # the reasoning phase ended: how and where
        events.append((EXIT, {GRAVITY_PREFIX + "step": gravity["reasoning_tokens"],
                              GRAVITY_PREFIX + "reason": gravity["exit"],
                              GRAVITY_PREFIX + "terminated_early": gravity["exit"] in ("gravity", "loop"),
                              GRAVITY_PREFIX + "probes": gravity["probes"]}))
    events.sort(key=lambda e: e[1][GRAVITY_PREFIX + "step"])
    session = gravity.get("session") or {}
    for kind in ("quantize", "trim"):
        report = session.get(kind)
        if report:
            events.append((KV_TRIM, {GRAVITY_PREFIX + "step": output_tokens, GRAVITY_PREFIX + "kv.action": kind,
                                     GRAVITY_PREFIX + "kv.policy": report["policy"],
                                     GRAVITY_PREFIX + "kv.bytes_before": report["bytes_before"],
                                     GRAVITY_PREFIX + "kv.bytes_after": report["bytes_after"],
                                     GRAVITY_PREFIX + "kv.entries_before": report["entries_before"],
                                     GRAVITY_PREFIX + "kv.entries_after": report["entries_after"],
                                     **({GRAVITY_PREFIX + "kv.bits": report["bits"]} if report.get("bits") else {})}))
    compute = gravity.get("compute") or {}
    for action, keys in COMPUTE_EVENTS.items():  # what each zone action did, when it did anything
        report = compute.get(action)
        if report and report[keys[0]]:
            events.append((GRAVITY_PREFIX + action, {GRAVITY_PREFIX + "step": output_tokens,
                                                     **{f"{GRAVITY_PREFIX}{action}.{k}": report[k] for k in keys}}))
    return events
