import math

import pytest
import torch

from agent_gravity.kernels import token_entropy


def _reference(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in float64 straight from the definition, masked entries skipped."""
    out = []
    for row in logits.double():
        finite = row[torch.isfinite(row)]
        p = torch.softmax(finite, dim=0)
        out.append(float(-(p * p.log()).sum()))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float16, 2e-2), (torch.bfloat16, 5e-2)])
def test_matches_definition_on_random_rows(dtype, tol):
    logits = (torch.randn(6, 4099, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    got = token_entropy(logits)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _reference(logits.float()), atol=tol, rtol=0)


def test_uniform_row_is_log_vocab_and_peaked_row_is_near_zero():
    uniform = torch.zeros(1, 1000)
    peaked = torch.full((1, 1000), -50.0)
    peaked[0, 7] = 50.0
    got = token_entropy(torch.cat([uniform, peaked]))
    assert got[0].item() == pytest.approx(math.log(1000), abs=1e-4)
    assert got[1].item() == pytest.approx(0.0, abs=1e-6)


def test_masked_entries_are_ignored_and_single_finite_entry_has_zero_entropy():
    logits = torch.full((2, 50), float("-inf"))
    logits[0, :4] = 0.0
    logits[1, 9] = 3.0
    got = token_entropy(logits)
    assert got[0].item() == pytest.approx(math.log(4), abs=1e-5)
    assert got[1].item() == 0.0
    assert not torch.isnan(got).any()


def test_rejects_a_vector():
    with pytest.raises(ValueError, match=r"\[rows, vocab\]"):
        token_entropy(torch.zeros(10))
