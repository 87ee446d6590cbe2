"""Risk-controlled calibration (Learn-then-Test) on synthetic losses whose answer is known."""

import math
import random
from fractions import Fraction

import pytest

from agent_gravity._risk import binomial_cdf, items_needed, learn_then_test, p_value, upper_bound


def test_binomial_tail_matches_direct_sums():
    assert binomial_cdf(0, 10, 0.1) == pytest.approx(0.9**10)
    direct = sum(math.comb(20, i) * 0.3**i * 0.7 ** (20 - i) for i in range(5))
    assert binomial_cdf(4, 20, 0.3) == pytest.approx(direct)
    assert binomial_cdf(-1, 5, 0.5) == 0.0 and binomial_cdf(5, 5, 0.5) == 1.0
    p = Fraction(1, 50)
    exact = sum(math.comb(3000, i) * p**i * (1 - p) ** (3000 - i) for i in range(31))
    assert binomial_cdf(30, 3000, 0.02) == pytest.approx(float(exact), rel=1e-9), "exact for many trials too"


def test_upper_bound_is_clopper_pearson():
    assert upper_bound(0, 45, 0.1) == pytest.approx(1 - 0.1 ** (1 / 45), abs=1e-9)  # the rule of three's exact form
    bound = upper_bound(3, 100, 0.1)
    assert binomial_cdf(3, 100, bound) == pytest.approx(0.1, abs=1e-9) and 0.03 < bound < 0.1
    assert upper_bound(0, 0, 0.1) == 1.0


def test_the_fewest_items_that_can_certify_anything():
    n = items_needed(0.05, 0.1)
    assert n == 45 and p_value(0, n, 0.05) <= 0.1 < p_value(0, n - 1, 0.05)


def test_it_picks_the_biggest_saving_among_candidates_that_pass_in_order():
    safe = [0] * 200
    some = [1] * 3 + [0] * 197  # 1.5% loss: certified at 5%
    many = [1] * 20 + [0] * 180  # 10% loss: not
    sel = learn_then_test([("a", safe, 0.1), ("b", some, 0.3), ("c", many, 0.6)], epsilon=0.05, delta=0.1)
    assert sel.chosen == "b" and sel.met
    assert [t.passed for t in sel.tests] == [True, True, False]
    assert sel.test("b").losses == 3 and sel.test("b").bound < 0.05


def test_fixed_sequence_stops_at_the_first_failure():
    """A safe candidate after a failing one is never tested: that is what keeps the error at delta."""
    sel = learn_then_test([("a", [0] * 200, 0.1), ("b", [1] * 30 + [0] * 170, 0.3), ("c", [0] * 200, 0.9)])
    assert sel.chosen == "a" and not sel.test("c").tested and not sel.test("c").passed


def test_it_refuses_when_the_bound_cannot_be_met():
    too_few = learn_then_test([("a", [0] * 20, 0.5)], epsilon=0.05, delta=0.1)
    assert too_few.chosen is None and not too_few.met, "20 clean items cannot certify 5% at 90%"
    lossy = learn_then_test([("a", [1] * 10 + [0] * 90, 0.5)], epsilon=0.05, delta=0.1)
    assert lossy.chosen is None and lossy.test("a").bound > 0.05


@pytest.mark.parametrize("true_risk, expect_pass", [(0.02, True), (0.08, False)])
def test_the_guarantee_holds_on_repeated_synthetic_draws(true_risk, expect_pass):
    """Over many calibration sets drawn from a known loss rate, a candidate riskier than epsilon passes at most
    delta of the time, and a clearly safe one passes most of the time."""
    rng, epsilon, delta = random.Random(7), 0.05, 0.1
    passes = sum(learn_then_test([("a", [int(rng.random() < true_risk) for _ in range(400)], 0.5)],
                                 epsilon, delta).met for _ in range(300))
    if expect_pass:
        assert passes / 300 > 0.8
    else:
        assert passes / 300 <= delta


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_levels_must_be_probabilities(bad):
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        learn_then_test([("a", [0], 0.0)], epsilon=bad)
    with pytest.raises(ValueError, match="delta"):
        learn_then_test([("a", [0], 0.0)], delta=bad)


def test_losses_must_be_zero_or_one():
    with pytest.raises(ValueError, match="0 or 1"):
        learn_then_test([("a", [0, 2], 0.0)])
    with pytest.raises(ValueError, match="at least one candidate"):
        learn_then_test([])
