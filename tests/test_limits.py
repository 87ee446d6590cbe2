"""Every size a request's settings carry is bounded: a huge value is refused with the field's name, never allocated."""

import math

import pytest
from pydantic import ValidationError

from agent_gravity import GravityConfig, KVConfig, ProbeConfig
from agent_gravity._limits import MAX_POLICIES, bounded
from agent_gravity._probe import ProbeSpec
from agent_gravity._steering import SteeringSpec
from agent_gravity.policies import POLICIES, policy_from_spec
from agent_gravity.trim import trim_policy_from_spec

HUGE = 10**9


@pytest.mark.parametrize(("name", "field"), [
    ("loop", "max_period"), ("loop", "repeats"), ("loop", "min_span"), ("loop", "threshold"),
    ("window_mean", "window"), ("window_mean", "patience"), ("window_mean", "threshold"),
    ("ewma", "warmup"), ("ewma", "threshold"), ("cusum", "window"), ("cusum", "warmup"), ("all_of", "within"),
])
def test_a_huge_policy_size_is_refused_naming_the_field(name, field):
    with pytest.raises(ValueError, match=f"{field} must be a number"):
        policy_from_spec({"name": name, field: HUGE})


def test_the_loop_that_took_gigabytes_is_a_validation_error_through_the_public_config():
    with pytest.raises(ValidationError, match="loop: max_period must be a number from 1 to 512, got 1000000000"):
        GravityConfig(loop={"name": "loop", "max_period": HUGE})


@pytest.mark.parametrize("field", ["agree", "tokens", "gap", "max_probes", "interval", "lenient_after", "hold"])
def test_probe_counts_are_bounded_in_the_config_and_on_the_engine_side(field):
    with pytest.raises(ValidationError, match=field):
        ProbeConfig(**{field: HUGE})
    with pytest.raises(ValueError, match=f"probe.{field} must be a number from 1 to"):
        ProbeSpec(**{field: HUGE})


@pytest.mark.parametrize("value", [True, math.nan, math.inf, "3", None])
def test_bounded_takes_finite_numbers_only(value):
    with pytest.raises(ValueError, match="x must be a number from 0 to 10"):
        bounded("x", value, 0, 10)


def test_composed_policies_are_bounded_in_number_and_so_in_depth():
    deep: dict = {"name": "window_mean"}
    for _ in range(MAX_POLICIES):
        deep = {"name": "any_of", "policies": [deep]}
    with pytest.raises(ValueError, match=f"at most {MAX_POLICIES} policies"):
        policy_from_spec(deep)
    wide = {"name": "any_of", "policies": [{"name": "ewma"}] * (10 * MAX_POLICIES)}
    with pytest.raises(ValueError, match=f"at most {MAX_POLICIES} policies"):
        policy_from_spec(wide)
    assert policy_from_spec({"name": "any_of", "policies": [{"name": "ewma"}] * (MAX_POLICIES - 1)})


@pytest.mark.parametrize(("field", "value"), [
    ("ratio", 1e12), ("sinks", HUGE), ("window", HUGE), ("trim_above", HUGE), ("quantize_below", 1e6),
    ("zone_patience", HUGE), ("compact_tool_outputs", HUGE),
])
def test_kv_settings_are_bounded(field, value):
    with pytest.raises(ValidationError, match=field):
        KVConfig(**{field: value})


@pytest.mark.parametrize("spec", [{"name": "head_entropy", "pool": HUGE}, {"name": "snapkv", "pool": HUGE},
                                  {"name": "head_entropy", "rigid_share": 2.0}])
def test_trim_policy_parameters_are_bounded(spec):
    with pytest.raises(ValueError, match="must be a number from"):
        trim_policy_from_spec(spec)


def _plugin_settings(**overrides):
    return {"key": "k", "eos_ids": [0], **overrides}


@pytest.mark.parametrize(("overrides", "field"), [
    ({"guard_ids": list(range(300_000))}, "guard_ids"),
    ({"eos_ids": list(range(1000))}, "eos_ids"),
    ({"key": "k" * 10_000}, "key"),
    ({"min_tokens": HUGE}, "min_tokens"),
    ({"probe": {"max_probes": HUGE}}, "probe.max_probes"),
    ({"loop": {"name": "loop", "max_period": HUGE}}, "max_period"),
])
def test_plugin_settings_from_vllm_xargs_are_bounded(overrides, field):
    with pytest.raises(ValueError, match=f"invalid agent_gravity settings.*{field}"):
        SteeringSpec.from_dict(_plugin_settings(**overrides))


def test_every_policy_defaults_are_within_the_bounds():
    for name in POLICIES:
        assert policy_from_spec({"name": name})
    assert SteeringSpec.from_dict(_plugin_settings(probe={}, min_tokens=16))
