"""attention_entropy: the Triton kernel (interpreter mode on CPU) against the reference, and the
reference against values known by construction."""

import math

import pytest
import torch

from agent_gravity.kernels import attention_entropy

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def qk(q_heads, kv_heads, n_queries, k_len, dim, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(q_heads, n_queries, dim, generator=g) * 2
    k = torch.randn(kv_heads, k_len, dim, generator=g)
    return q.to(DEVICE, dtype), k.to(DEVICE, dtype)


def test_uniform_attention_has_the_log_of_the_visible_keys():
    q = torch.zeros(2, 3, 16, device=DEVICE)
    k = torch.randn(1, 10, 16, device=DEVICE)
    positions = torch.tensor([0, 4, 9], device=DEVICE)
    segments = torch.tensor([[0, 10], [5, 10]], device=DEVICE)
    for impl in ("torch", "triton"):
        got = attention_entropy(q, k, positions, segments, impl=impl).cpu()
        assert got[:, :, 0].flatten().tolist() == pytest.approx([0.0, math.log(5), math.log(10)] * 2, abs=1e-5)
        assert math.isnan(got[0, 0, 1]) and math.isnan(got[0, 1, 1])  # those queries see no key there
        assert got[0, 2, 1].item() == pytest.approx(math.log(5), abs=1e-5)


def test_each_query_head_reads_its_own_kv_group():
    q = torch.zeros(4, 1, 16, device=DEVICE)
    q[:, :, 0] = 400.0  # scores of 100 against 0: all attention on one key
    k = torch.zeros(2, 8, 16, device=DEVICE)
    k[0, 3, 0] = 1.0  # KV head 0: one key stands out, attention is sharp
    for impl in ("torch", "triton"):
        got = attention_entropy(q, k, impl=impl)[:, 0, 0].cpu()
        assert got[:2].tolist() == pytest.approx([0.0, 0.0], abs=1e-4)  # query heads 0, 1 -> KV head 0
        assert got[2:].tolist() == pytest.approx([math.log(8)] * 2, abs=1e-4)  # heads 2, 3 -> KV head 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(9, 3, 20, 150, 64), (4, 4, 5, 37, 24), (8, 1, 17, 200, 32)])
def test_kernel_matches_reference(dtype, causal, shape):
    q, k = qk(*shape, dtype=dtype, seed=sum(shape))
    k_len = shape[3]
    segments = torch.tensor([[0, 4], [4, k_len // 2], [k_len // 2, k_len]], device=DEVICE)
    want = attention_entropy(q, k, segments=segments, causal=causal, impl="torch")
    got = attention_entropy(q, k, segments=segments, causal=causal, impl="triton")
    torch.testing.assert_close(got, want, atol=TOL[dtype] * 10, rtol=TOL[dtype], equal_nan=True)


def test_kernel_matches_reference_on_chosen_query_positions():
    q, k = qk(6, 2, 4, 90, 32)
    positions = torch.tensor([0, 30, 89, 45], device=DEVICE)
    segments = torch.tensor([[0, 1], [1, 60], [60, 90]], device=DEVICE)
    want = attention_entropy(q, k, positions, segments, impl="torch")
    got = attention_entropy(q, k, positions, segments, impl="triton")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert torch.isnan(got[:, 0, 1:]).all()  # position 0 sees only the first key


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="cannot share"):
        attention_entropy(torch.zeros(3, 1, 16), torch.zeros(2, 4, 16))
    with pytest.raises(ValueError, match="equal dim"):
        attention_entropy(torch.zeros(2, 1, 16), torch.zeros(2, 4, 8))


def test_segments_past_the_keys_are_clipped_not_read():
    q, k = qk(2, 1, 3, 40, 16)
    wide = torch.tensor([[-5, 20], [20, 400]], device=DEVICE)
    exact = torch.tensor([[0, 20], [20, 40]], device=DEVICE)
    for impl in ("torch", "triton"):
        torch.testing.assert_close(attention_entropy(q, k, segments=wide, impl=impl),
                                   attention_entropy(q, k, segments=exact, impl="torch"), atol=1e-4, rtol=1e-4)
