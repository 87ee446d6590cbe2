"""Entropy from top log-probabilities: the exact entropy always lies within the stated bound."""

import math
import random

import pytest
import torch

from agent_gravity.backends._logprob_entropy import estimate_entropy


def _exact(probs: torch.Tensor) -> float:
    return float(-torch.special.xlogy(probs, probs).sum())


@pytest.mark.parametrize("temperature", [0.3, 1.0, 3.0])
@pytest.mark.parametrize("k", [1, 5, 20])
def test_the_exact_entropy_is_within_the_bound_of_the_estimate(temperature, k):
    gen = torch.Generator().manual_seed(k)
    for _ in range(50):
        logits = torch.randn(1000, generator=gen) * 4 / temperature
        probs = logits.double().softmax(-1)
        top = probs.topk(k).values.log().tolist()
        est = estimate_entropy(top, vocab_size=1000, top_k=k)
        assert abs(est.value - _exact(probs)) <= est.bound + 1e-9


def test_a_sampled_token_beyond_the_top_k_does_not_loosen_the_cap():
    probs = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05], dtype=torch.float64)
    shown = [math.log(0.5), math.log(0.3), math.log(0.05)]  # top 2, and a sampled tail token
    est = estimate_entropy(shown, vocab_size=5, top_k=2)
    assert abs(est.value - _exact(probs)) <= est.bound + 1e-12


def test_the_whole_distribution_gives_the_exact_entropy_with_no_bound():
    probs = torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64)
    est = estimate_entropy(probs.log().tolist(), vocab_size=3)
    assert est.bound == 0.0
    assert est.value == pytest.approx(_exact(probs))


def test_the_bound_shrinks_as_more_of_the_mass_is_shown():
    rng = random.Random(0)
    logits = torch.tensor([rng.gauss(0, 3) for _ in range(500)])
    lps = logits.log_softmax(-1).sort(descending=True).values.tolist()
    bounds = [estimate_entropy(lps[:k], 500, k).bound for k in (1, 5, 20, 100)]
    assert bounds == sorted(bounds, reverse=True) and bounds[-1] < bounds[0]


def test_no_finite_log_probability_is_refused():
    with pytest.raises(ValueError, match="no finite log-probability"):
        estimate_entropy([-math.inf], vocab_size=10)


def test_log_probabilities_too_small_for_a_float_still_give_an_estimate():
    est = estimate_entropy([-0.05, -800.0, -1e4], vocab_size=50_000, top_k=3)
    assert math.isfinite(est.value) and math.isfinite(est.bound)
