"""Hypothesis fuzzes GravityConfig and KVConfig: every input is accepted or refused with a ValidationError that says
what to fix, never another exception, a hang or an unbounded allocation; what is accepted builds and runs."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent_gravity import GravityConfig, KVConfig
from agent_gravity.policies import POLICIES, Observation, policy_from_spec
from agent_gravity.trim import TRIM_POLICIES, trim_policy_from_spec

pytestmark = pytest.mark.timeout(120)  # a hang fails the test instead of the run

numbers = (st.integers(-3, 64) | st.integers() | st.sampled_from([2**63, 10**12, 10**400])
           | st.floats() | st.floats(-2, 16))
leaves = st.none() | st.booleans() | numbers | st.text(max_size=8)
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
PARAMETERS = sorted({name for cls in POLICIES.values() for name in getattr(cls, "__dataclass_fields__", {})
                     if not name.startswith("_")})


def _policies(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    """Policy specs: known and unknown names, known and unknown parameters, nested compositions."""
    params = st.dictionaries(st.sampled_from(PARAMETERS) | st.text(max_size=6), numbers | leaves, max_size=3)
    leaf = st.builds(lambda name, p: {"name": name, **p}, st.sampled_from(sorted(POLICIES)) | st.text(max_size=6),
                     params)
    if depth == 0:
        return leaf
    composed = st.builds(lambda name, children, within: {"name": name, "policies": children, "within": within},
                         st.sampled_from(["all_of", "any_of"]), st.lists(_policies(depth - 1), max_size=20),
                         numbers)
    return leaf | composed


probe = st.none() | st.dictionaries(st.sampled_from(["agree", "tokens", "gap", "max_probes", "interval",
                                                     "min_confidence", "lenient_after", "hold", "typo"]),
                                    numbers | leaves, max_size=4)
gravity = st.fixed_dictionaries({}, optional={
    "enabled": st.booleans() | leaves, "policy": st.none() | _policies(2) | json_values,
    "probe": probe, "loop": st.none() | _policies(0) | json_values, "min_tokens": numbers | leaves,
    "max_reasoning_tokens": numbers | leaves, "max_answer_tokens": numbers | leaves,
    "reasoning": st.none() | st.just("auto") | st.dictionaries(
        st.sampled_from(["start", "end", "answer_prefix", "scaffold"]), st.text(max_size=300) | leaves, max_size=3),
    "excluded_tasks": st.frozensets(st.text(max_size=6), max_size=3) | json_values,
    "windw": leaves})
kv = st.fixed_dictionaries({}, optional={
    "policy": st.builds(lambda name, p: {"name": name, **p}, st.sampled_from(sorted(TRIM_POLICIES))
                        | st.text(max_size=6), st.dictionaries(st.sampled_from(
                            ["pool", "rigid_below", "rigid_share", "protect", "x"]), numbers | leaves, max_size=2))
    | json_values,
    **{name: numbers | leaves for name in ("ratio", "sinks", "window", "trim_above", "quantize_below",
                                           "zone_patience", "compact_tool_outputs", "trim", "kept_bits")}})

SEEN: Counter[str] = Counter()


def _refused_clearly(error: ValidationError) -> None:
    assert error.errors() and all(e["msg"] for e in error.errors())


def _runs(spec: dict[str, Any] | None) -> None:
    """An accepted policy spec builds and takes a stretch of observations."""
    if spec is None:
        return
    policy = policy_from_spec(spec)
    for step in range(64):
        policy.observe(Observation(step, step % 5, 0.1 if step > 20 else 2.0, 0.2))


@settings(max_examples=1500, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(gravity)
def _fuzz_gravity(data: dict[str, Any]) -> None:
    try:
        config = GravityConfig(**data)
    except ValidationError as error:
        _refused_clearly(error)
        SEEN["gravity refused"] += 1
        return
    _runs(config.policy)
    _runs(config.loop)
    if config.probe is not None:
        config.probe.spec()
    SEEN["gravity accepted"] += 1


@settings(max_examples=800, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
@given(kv)
def _fuzz_kv(data: dict[str, Any]) -> None:
    try:
        config = KVConfig(**data)
    except ValidationError as error:
        _refused_clearly(error)
        SEEN["kv refused"] += 1
        return
    trim_policy_from_spec(config.policy)
    assert math.isfinite(config.ratio) and 1 <= config.ratio
    SEEN["kv accepted"] += 1


@pytest.mark.parametrize(("fuzz", "kind"), [(_fuzz_gravity, "gravity"), (_fuzz_kv, "kv")])
def test_every_config_is_accepted_or_refused_clearly_and_both_outcomes_are_reached(fuzz, kind):
    SEEN.clear()
    fuzz()
    print(f"{kind}: {dict(SEEN)}")  # the counts for the closing note (pytest -s)
    assert SEEN[f"{kind} refused"] > 0 and SEEN[f"{kind} accepted"] > 0
