import pytest
from pydantic import ValidationError

from agent_gravity import GravityConfig, ProbeConfig
from agent_gravity._calibrate import Candidate, candidates


@pytest.mark.parametrize("field", ["max_reasoning_tokens", "max_answer_tokens"])
@pytest.mark.parametrize("value", [0, 10**9])
def test_budgets_must_be_positive_and_bounded(field, value):
    with pytest.raises(ValidationError, match=f"{field} must be a number from 1 to 131072, got {value}"):
        GravityConfig(**{field: value})


@pytest.mark.parametrize(("policy", "message"), [
    ({"name": "window_mean", "window": 0}, "policy: window must be a number from 1 to 4096, got 0"),
    ({"name": "window_mean", "threshold": -1.0}, "threshold must be a number above 0"),
    ({"name": "nope"}, "unknown gravity policy 'nope'"),
    ({"name": "all_of", "policies": [{"name": "ewma", "alpha": 2}]}, "alpha must be a number above 0 and at most 1"),
    ("window_mean", "valid dictionary"),
])
def test_a_bad_policy_spec_is_refused_with_what_to_fix(policy, message):
    with pytest.raises(ValidationError, match=message):
        GravityConfig(policy=policy)


def test_a_bad_loop_or_probe_setting_is_refused():
    with pytest.raises(ValidationError, match="loop: repeats must be a number from 2 to 16"):
        GravityConfig(loop={"name": "loop", "repeats": 1})
    with pytest.raises(ValidationError, match="agree"):
        GravityConfig(probe=ProbeConfig(agree=0))
    with pytest.raises(ValueError, match="threshold factors must be positive"):
        candidates(GravityConfig(), (Candidate("a"), Candidate("b", 0.0)))
    with pytest.raises(ValidationError, match="min_confidence"):
        ProbeConfig(min_confidence=1.5)
    with pytest.raises(ValidationError, match="min_confidnce"):
        candidates(GravityConfig(), (Candidate("typo", 1.0, {"min_confidnce": 0.5}),))


def test_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="windw"):
        GravityConfig(windw=5)


def test_excluded_tasks_and_disabled_configs_never_fire():
    config = GravityConfig()
    assert config.active_for(None) and config.active_for("math")
    assert not config.active_for("legal") and not config.active_for("creative_writing")
    assert not GravityConfig(enabled=False).active_for(None)
    assert GravityConfig(excluded_tasks={"math"}).active_for("legal") is True


def test_default_configs_do_not_share_policy_specs():
    first, second = GravityConfig(), GravityConfig()
    assert first.policy == second.policy and first.policy is not second.policy


def test_the_loop_slot_takes_only_a_loop_policy():
    with pytest.raises(ValidationError, match="loop takes a loop policy spec"):
        GravityConfig(loop={"name": "window_mean"})


def test_a_config_where_gravity_could_never_fire_is_refused():
    with pytest.raises(ValidationError, match="min_tokens \\(300\\) must be below max_reasoning_tokens"):
        GravityConfig(min_tokens=300, max_reasoning_tokens=256)
    GravityConfig(enabled=False, min_tokens=300, max_reasoning_tokens=256)
