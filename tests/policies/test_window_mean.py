import pytest

from agent_gravity.policies import WindowMeanPolicy


def test_fires_at_the_first_full_window_whose_mean_is_under_threshold():
    policy = WindowMeanPolicy(window=4, threshold=1.0)
    stream = [2.0, 2.0, 0.5, 0.5, 0.5, 0.5]
    locks = [policy.observe(i, e) for i, e in enumerate(stream)]
    # windows: [2,2,.5,.5]=1.25, [2,.5,.5,.5]=0.875 -> fires at step 4
    assert locks[:4] == [None] * 4
    assert locks[4].step == 4
    assert locks[4].values["mean_entropy"] == pytest.approx(0.875)


def test_needs_a_full_window():
    policy = WindowMeanPolicy(window=5, threshold=1.0)
    assert [policy.observe(i, 0.0) for i in range(4)] == [None] * 4


def test_rejects_an_empty_window():
    with pytest.raises(ValueError, match="window must be >= 1"):
        WindowMeanPolicy(window=0)
