"""One suite, run over every gravity policy."""

import random

import pytest

from agent_gravity.policies import POLICIES, GravityPolicy, Lock, Observation, policy_from_spec

ALL = sorted(POLICIES)


def feed(policy, stream):
    """Feed ``(token, entropy, varentropy)`` triples; return the lock (or None) of every step."""
    return [policy.observe(Observation(step, token, h, v)) for step, (token, h, v) in enumerate(stream)]


def uncertain(n, seed=0):
    rng = random.Random(seed)
    return [(rng.randrange(1000), rng.uniform(2.0, 4.0), rng.uniform(2.0, 6.0)) for _ in range(n)]


def locked_in(n, cycle=5):
    """A converged stretch: near-zero entropy, the model writing the same few tokens."""
    return [(900 + i % cycle, 0.01, 0.02) for i in range(n)]


@pytest.mark.parametrize("name", ALL)
def test_is_a_policy_and_builds_from_its_spec(name):
    policy = policy_from_spec({"name": name})
    assert isinstance(policy, GravityPolicy)
    assert policy.name == name


@pytest.mark.parametrize("name", ALL)
def test_never_locks_on_a_high_entropy_stream(name):
    assert not any(feed(policy_from_spec({"name": name}), uncertain(500)))


@pytest.mark.parametrize("name", ALL)
def test_locks_on_a_long_low_entropy_stretch_and_says_why(name):
    locks = feed(policy_from_spec({"name": name}), uncertain(30) + locked_in(170))
    fired = [lock for lock in locks if lock is not None]
    assert fired, "a long stretch near 0 nats must lock"
    first = fired[0]
    assert isinstance(first, Lock) and first.step >= 30 and first.reason in ("gravity", "loop")
    assert name in first.policy and first.values and name in first.describe()


@pytest.mark.parametrize("name", ALL)
def test_steps_the_engine_never_showed_are_no_evidence(name):
    nan = float("nan")
    locks = feed(policy_from_spec({"name": name}), [(900, nan, nan)] * 200)
    assert not any(locks)


@pytest.mark.parametrize("name", ALL)
def test_fresh_policies_from_one_spec_share_no_state(name):
    stream = uncertain(30) + locked_in(100)
    first = feed(policy_from_spec({"name": name}), stream)
    second = feed(policy_from_spec({"name": name}), stream)
    assert [lock and lock.step for lock in first] == [lock and lock.step for lock in second]


@pytest.mark.parametrize("name", ALL)
def test_bad_parameters_are_a_clear_error(name):
    with pytest.raises(ValueError, match=name):
        policy_from_spec({"name": name, "no_such_parameter": 1})


def test_unknown_policy_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown gravity policy 'nope'"):
        policy_from_spec({"name": "nope"})


@pytest.mark.parametrize("name", ALL)
def test_a_lock_names_the_step_it_was_given(name):
    locks = feed(policy_from_spec({"name": name}), uncertain(30) + locked_in(100))
    assert all(lock.step == step for step, lock in enumerate(locks) if lock is not None)


@pytest.mark.parametrize("name", ALL)
def test_a_backend_without_varentropy_still_gets_a_verdict(name):
    stream = [(tok, h, float("nan")) for tok, h, _ in uncertain(30) + locked_in(170)]
    assert any(feed(policy_from_spec({"name": name}), stream))
