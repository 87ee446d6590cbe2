"""One suite, run over every gravity policy."""

import pytest

from agent_gravity.policies import POLICIES, GravityPolicy, Lock, policy_from_spec

ALL = sorted(POLICIES)


@pytest.mark.parametrize("name", ALL)
def test_is_a_policy_and_builds_from_its_spec(name):
    policy = policy_from_spec({"name": name})
    assert isinstance(policy, GravityPolicy)
    assert policy.name == name


@pytest.mark.parametrize("name", ALL)
def test_never_locks_on_a_high_entropy_stream(name):
    policy = policy_from_spec({"name": name})
    assert all(policy.observe(step, 3.0) is None for step in range(500))


@pytest.mark.parametrize("name", ALL)
def test_locks_on_a_long_low_entropy_stretch_and_says_why(name):
    policy = policy_from_spec({"name": name})
    locks = [policy.observe(step, 3.0) for step in range(20)]
    locks += [policy.observe(step, 0.01) for step in range(20, 200)]
    fired = [lock for lock in locks if lock is not None]
    assert fired, "a long stretch near 0 nats must lock"
    first = fired[0]
    assert isinstance(first, Lock) and first.policy == name and first.step >= 20
    assert first.values and name in first.describe()


def test_unknown_policy_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown gravity policy 'nope'"):
        policy_from_spec({"name": "nope"})
