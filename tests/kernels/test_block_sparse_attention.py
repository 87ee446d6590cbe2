"""block_sparse_attention: the Triton kernel (interpreter mode on CPU) against the reference, a table that lists
every block is causal attention, and the log-sum-exp merges disjoint passes exactly."""

import math

import pytest
import torch

from agent_gravity.kernels import block_sparse_attention

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BLOCK, DIM = 16, 16


def qkv(heads=4, kv_heads=2, n=40, keys=72, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((heads, n, DIM), (kv_heads, keys, DIM), (kv_heads, keys, DIM))
    return tuple(torch.randn(*shape, generator=g).to(DEVICE) for shape in shapes)


def table_of(lists):
    """``lists[h][j]``: key block ids of head h's query block j; padded to one width."""
    width = max(len(ids) for per_head in lists for ids in per_head)
    table = torch.full((len(lists), len(lists[0]), width), -1, dtype=torch.int32)
    counts = torch.zeros(len(lists), len(lists[0]), dtype=torch.int32)
    for h, per_head in enumerate(lists):
        for j, ids in enumerate(per_head):
            table[h, j, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
            counts[h, j] = len(ids)
    return table.to(DEVICE), counts.to(DEVICE)


def diagonal(j, n, keys):
    return (keys - n + min((j + 1) * BLOCK, n) - 1) // BLOCK


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_a_table_of_every_block_is_causal_attention(impl):
    q, k, v = qkv()
    n, keys = q.shape[1], k.shape[1]
    table, counts = table_of([[list(range(diagonal(j, n, keys) + 1)) for j in range(math.ceil(n / BLOCK))]] * 4)
    out, lse = block_sparse_attention(q, k, v, table, counts, BLOCK, impl=impl)
    kk, vv = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
    mask = torch.ones(n, keys, dtype=torch.bool, device=DEVICE).tril(keys - n)
    want = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    scores = (q @ kk.transpose(1, 2) / math.sqrt(DIM)).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), atol=1e-4, rtol=1e-4)


def test_the_kernel_matches_the_reference_on_sparse_tables_with_rows_that_see_nothing():
    q, k, v = qkv(seed=1)
    n, keys = q.shape[1], k.shape[1]
    last = [diagonal(j, n, keys) for j in range(3)]
    lists = [[[0, *range(max(0, d - 1), d + 1)] for d in last],  # sinks and a local window
             [[2, d] for d in last],                             # a far block
             [[4] for _ in last],                                # only the future: sees nothing
             [[1, 3] for _ in last]]
    table, counts = table_of(lists)
    want = block_sparse_attention(q, k, v, table, counts, BLOCK, impl="torch")
    got = block_sparse_attention(q, k, v, table, counts, BLOCK, impl="triton")
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=1e-4)
    assert torch.isneginf(got[1][2, :8]).all() and (got[0][2, :8] == 0).all()  # rows 0..7 sit at positions 32..39


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_two_passes_over_disjoint_blocks_merge_into_one_by_their_log_sum_exp(impl):
    q, k, v = qkv(heads=2, kv_heads=1, n=32, keys=64, seed=2)
    both = table_of([[[0, 2, 3]] * 2] * 2)
    first, second = table_of([[[0]] * 2] * 2), table_of([[[2, 3]] * 2] * 2)
    (o1, l1), (o2, l2) = (block_sparse_attention(q, k, v, *t, BLOCK, impl=impl) for t in (first, second))
    top = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - top), torch.exp(l2 - top)
    merged = (o1 * w1[..., None] + o2 * w2[..., None]) / (w1 + w2)[..., None]
    torch.testing.assert_close(merged, block_sparse_attention(q, k, v, *both, BLOCK, impl=impl)[0], atol=1e-4,
                               rtol=1e-4)


def test_bad_shapes_say_what_to_fix():
    q, k, v = qkv()
    table, counts = table_of([[[0]] * 3] * 4)
    with pytest.raises(ValueError, match="equal dim"):
        block_sparse_attention(q, k[..., :8], v[..., :8], table, counts, BLOCK)
    with pytest.raises(ValueError, match="share KV heads evenly"):
        block_sparse_attention(q[:3], k, v, table[:3], counts[:3], BLOCK)
    with pytest.raises(ValueError, match=r"table must be \[4, 3, width\]"):
        block_sparse_attention(q, k, v, table[:, :2], counts[:, :2], BLOCK)
