import pytest

from agent_gravity.policies import Observation, WindowMeanPolicy


def run(policy, entropies):
    return [policy.observe(Observation(i, 0, e)) for i, e in enumerate(entropies)]


def test_fires_at_the_first_full_window_whose_mean_is_under_threshold():
    locks = run(WindowMeanPolicy(window=4, threshold=1.0), [2.0, 2.0, 0.5, 0.5, 0.5, 0.5])
    # windows: [2,2,.5,.5]=1.25, [2,.5,.5,.5]=0.875 -> fires at step 4
    assert locks[:4] == [None] * 4
    assert locks[4].step == 4
    assert locks[4].values["mean_entropy"] == pytest.approx(0.875)


def test_needs_a_full_window():
    assert run(WindowMeanPolicy(window=5, threshold=1.0), [0.0] * 4) == [None] * 4


def test_patience_keeps_one_short_low_stretch_from_firing():
    stream = [2.0] * 4 + [0.1] * 3 + [2.0] * 6
    assert not any(run(WindowMeanPolicy(window=2, threshold=0.5, patience=3), stream))
    assert any(run(WindowMeanPolicy(window=2, threshold=0.5, patience=1), stream))


def test_hysteresis_holds_the_lock_until_the_mean_rises_past_release():
    policy = WindowMeanPolicy(window=1, threshold=0.5, release=1.0)
    locks = run(policy, [0.1, 0.8, 0.9, 1.2, 0.8])
    assert [lock is not None for lock in locks] == [True, True, True, False, False]


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match="window must be a number from 1"):
        WindowMeanPolicy(window=0)
    with pytest.raises(ValueError, match="release"):
        WindowMeanPolicy(threshold=1.0, release=0.5)
