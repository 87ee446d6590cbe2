"""What each policy adds beyond the shared suite."""

import pytest

from agent_gravity.policies import Observation, policy_from_spec


def run(spec, stream):
    policy = policy_from_spec(spec)
    return [policy.observe(Observation(i, tok, h, v)) for i, (tok, h, v) in enumerate(stream)]


def test_ewma_needs_varentropy_low_too():
    torn = [(1, 0.3, 4.0)] * 50  # low entropy, but split between two choices
    assert not any(run({"name": "ewma"}, torn))
    assert any(run({"name": "ewma"}, [(1, 0.3, 0.5)] * 50))


def test_cusum_fires_on_the_shift_not_on_a_steady_low_level():
    steady = [(1, 0.5, 0.1)] * 100
    assert not any(run({"name": "cusum"}, steady)), "no change point in a flat stream"
    shift = [(1, 3.0, 1.0)] * 12 + [(1, 0.2, 0.1)] * 20
    locks = run({"name": "cusum"}, shift)
    first = next(lock for lock in locks if lock)
    assert 12 < first.step < 20 and first.values["cusum"] >= 5.0


def test_loop_needs_repetition_and_low_entropy():
    loop = [(10 + i % 6, 0.05, 0.1) for i in range(60)]
    locks = run({"name": "loop"}, loop)
    first = next(lock for lock in locks if lock)
    assert first.reason == "loop" and first.values["period"] == 6 and first.values["span"] >= 24
    assert first.step == 23  # 4 copies of 6 tokens cover the 24-token minimum span
    assert not any(run({"name": "loop"}, [(10 + i % 6, 2.5, 3.0) for i in range(60)])), "unsure repetition"
    assert not any(run({"name": "loop"}, [(i, 0.05, 0.1) for i in range(60)])), "confident, not repeating"


def test_all_of_waits_for_every_child_within_the_window():
    spec = {"name": "all_of", "within": 0, "policies": [
        {"name": "window_mean", "window": 2, "threshold": 0.5},
        {"name": "window_mean", "window": 6, "threshold": 0.5}]}
    locks = run(spec, [(1, 2.0, 1.0)] * 6 + [(1, 0.1, 0.1)] * 10)
    first = next(lock for lock in locks if lock)
    assert first.step == 10  # the 6-token window needs 5 low tokens to fall under 0.5
    assert first.policy == "all_of(window_mean, window_mean)"
    assert first.values["window_mean#0.window"] == 2 and first.values["window_mean#1.window"] == 6


def test_any_of_names_the_child_that_fired_and_keeps_the_loop_reason():
    spec = {"name": "any_of", "policies": [{"name": "window_mean", "threshold": 0.01}, {"name": "loop"}]}
    locks = run(spec, [(10 + i % 6, 0.05, 0.1) for i in range(60)])
    first = next(lock for lock in locks if lock)
    assert first.policy == "any_of(loop)" and first.reason == "loop"


def test_composition_rejects_an_empty_or_bad_child_list():
    with pytest.raises(ValueError, match="all_of needs a non-empty list"):
        policy_from_spec({"name": "all_of", "policies": []})
    with pytest.raises(ValueError, match="unknown gravity policy"):
        policy_from_spec({"name": "any_of", "policies": [{"name": "nope"}]})
