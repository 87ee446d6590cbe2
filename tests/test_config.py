import pytest
from pydantic import ValidationError

from agent_gravity import GravityConfig


@pytest.mark.parametrize("window", [0, -3])
def test_window_must_be_positive(window):
    with pytest.raises(ValidationError, match="window must be a positive number of tokens"):
        GravityConfig(window=window)


@pytest.mark.parametrize("threshold", ["low", None, [1.0], True])
def test_threshold_must_be_a_number(threshold):
    with pytest.raises(ValidationError, match="threshold must be a number of nats"):
        GravityConfig(threshold=threshold)


@pytest.mark.parametrize("threshold", [float("nan"), float("inf"), 0, -1.0])
def test_threshold_must_be_finite_and_positive(threshold):
    with pytest.raises(ValidationError, match="threshold"):
        GravityConfig(threshold=threshold)


def test_unknown_field_is_refused():
    with pytest.raises(ValidationError, match="windw"):
        GravityConfig(windw=5)


def test_disabled_config_has_no_policy():
    assert GravityConfig(enabled=False).policy_spec() is None
    assert GravityConfig(window=7, threshold=0.3).policy_spec() == {
        "name": "window_mean", "window": 7, "threshold": 0.3}


def test_a_config_where_gravity_could_never_fire_is_refused():
    with pytest.raises(ValidationError, match="min_tokens \\(300\\) must be below max_reasoning_tokens"):
        GravityConfig(min_tokens=300, max_reasoning_tokens=256)
    GravityConfig(enabled=False, min_tokens=300, max_reasoning_tokens=256)
