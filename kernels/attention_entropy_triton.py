"""Triton kernel for :func:`agent_gravity.kernels.attention_entropy`: tiles of queries stream over
the keys of one segment with an online log-sum-exp, so no attention matrix is ever stored."""

from __future__ import annotations

import math

import triton
import triton.language as tl

BLOCK_Q = 16
BLOCK_K = 64


@triton.jit
def _attention_entropy_kernel(q_ptr, k_ptr, pos_ptr, seg_ptr, out_ptr,
                              n_queries, dim, group, scale,
                              sq_h, sq_q, sk_h, sk_k, so_h, so_q, n_segments,
                              CAUSAL: tl.constexpr, BLOCK_QS: tl.constexpr, BLOCK_KS: tl.constexpr,
                              BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    qb = tl.program_id(1)
    seg = tl.program_id(2)
    kv_h = (h // group).to(tl.int64)  # head offsets overflow int32 on long contexts
    h = h.to(tl.int64)
    rows = qb * BLOCK_QS + tl.arange(0, BLOCK_QS)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n_queries
    q = tl.load(q_ptr + h * sq_h + rows[:, None] * sq_q + dims[None, :],
                mask=row_ok[:, None] & (dims[None, :] < dim), other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + rows, mask=row_ok, other=0)
    start = tl.load(seg_ptr + seg * 2)
    end = tl.load(seg_ptr + seg * 2 + 1)
    m = tl.full((BLOCK_QS,), float("-inf"), tl.float32)
    s0 = tl.zeros((BLOCK_QS,), tl.float32)
    s1 = tl.zeros((BLOCK_QS,), tl.float32)
    for off in range(start, end, BLOCK_KS):
        keys = off + tl.arange(0, BLOCK_KS)
        k = tl.load(k_ptr + kv_h * sk_h + keys[:, None] * sk_k + dims[None, :],
                    mask=(keys[:, None] < end) & (dims[None, :] < dim), other=0.0).to(tl.float32)
        x = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # tf32 would blur low entropies
        visible = keys[None, :] < end
        if CAUSAL:
            visible = visible & (keys[None, :] <= pos[:, None])
        x = tl.where(visible, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        d = tl.where(s0 > 0, m_new - m, 0.0)
        shrink = tl.where(s0 > 0, tl.exp(m - m_new), 0.0)
        s1 = shrink * (s1 - d * s0)
        s0 = shrink * s0
        m = m_new
        y = x - tl.where(m == float("-inf"), 0.0, m)[:, None]
        e = tl.where(visible, tl.exp(y), 0.0)
        s0 += tl.sum(e, axis=1)
        s1 += tl.sum(tl.where(visible, e * y, 0.0), axis=1)
    entropy = tl.where(s0 > 0, tl.log(s0) - s1 / s0, float("nan"))
    tl.store(out_ptr + h * so_h + rows * so_q + seg, entropy, mask=row_ok)


def attention_entropy_triton(q, k, positions=None, segments=None, causal: bool = True, scale: float | None = None):
    """Triton implementation; see :func:`agent_gravity.kernels.attention_entropy`."""
    import torch

    from agent_gravity.kernels.attention_entropy_ref import default_positions

    q_heads, n_queries, dim = q.shape
    kv_heads, k_len, _ = k.shape
    q, k = q.contiguous(), k.contiguous()
    positions = default_positions(n_queries, k_len, q.device) if positions is None else positions
    segments = torch.tensor([[0, k_len]], device=q.device) if segments is None else segments
    positions = positions.to(device=q.device, dtype=torch.int32).contiguous()
    segments = segments.clamp(0, k_len).to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty(q_heads, n_queries, segments.shape[0], dtype=torch.float32, device=q.device)
    grid = (q_heads, triton.cdiv(n_queries, BLOCK_Q), segments.shape[0])
    _attention_entropy_kernel[grid](
        q, k, positions, segments, out, n_queries, dim, q_heads // kv_heads,
        1.0 / math.sqrt(dim) if scale is None else scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), segments.shape[0],
        CAUSAL=causal, BLOCK_QS=BLOCK_Q, BLOCK_KS=BLOCK_K, BLOCK_D=max(16, triton.next_power_of_2(dim)),
    )
    return out
