"""Triton kernel for :func:`agent_gravity.kernels.block_sparse_attention`: one program per query head and query
block streams over the key blocks its table lists with an online softmax (FlashAttention's recurrence), so the
work is the listed blocks only and no attention matrix is stored."""

from __future__ import annotations

import math

import triton
import triton.language as tl


@triton.jit
def _block_sparse_kernel(q_ptr, k_ptr, v_ptr, table_ptr, count_ptr, out_ptr, lse_ptr,
                         n, keys, dim, group, scale,
                         sq_h, sq_n, sk_h, sk_n, sv_h, sv_n, so_h, so_n, st_h, st_b, sc_h, sl_h,
                         BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    qb = tl.program_id(1)
    kv_h = (h // group).to(tl.int64)  # head offsets overflow int32 on long contexts
    h = h.to(tl.int64)
    rows = qb * BLOCK + tl.arange(0, BLOCK)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n
    dim_ok = dims[None, :] < dim
    positions = keys - n + rows
    q = tl.load(q_ptr + h * sq_h + rows[:, None] * sq_n + dims[None, :], mask=row_ok[:, None] & dim_ok, other=0.0)
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK,), tl.float32)
    acc = tl.zeros((BLOCK, BLOCK_D), tl.float32)
    count = tl.load(count_ptr + h * sc_h + qb)
    for i in range(0, count):
        b = tl.load(table_ptr + h * st_h + qb * st_b + i)
        cols = b * BLOCK + tl.arange(0, BLOCK)
        col_ok = cols < keys
        k = tl.load(k_ptr + kv_h * sk_h + cols[:, None] * sk_n + dims[None, :], mask=col_ok[:, None] & dim_ok,
                    other=0.0)
        v = tl.load(v_ptr + kv_h * sv_h + cols[:, None] * sv_n + dims[None, :], mask=col_ok[:, None] & dim_ok,
                    other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        visible = col_ok[None, :] & (cols[None, :] <= positions[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet stays at zero
        alpha = tl.exp(m - base)
        p = tl.where(visible, tl.exp(s - base[:, None]), 0.0)
        total = total * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m = m_new
    seen = total > 0
    out = acc / tl.where(seen, total, 1.0)[:, None]
    tl.store(out_ptr + h * so_h + rows[:, None] * so_n + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok)
    lse = tl.where(seen, m + tl.log(tl.where(seen, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + h * sl_h + rows, lse, mask=row_ok)


def block_sparse_attention_triton(q, k, v, table, counts, block: int, scale: float | None = None):
    """Triton implementation; see :func:`agent_gravity.kernels.block_sparse_attention`."""
    import torch

    heads, n, dim = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    table = table.to(device=q.device, dtype=torch.int32).contiguous()
    counts = counts.to(device=q.device, dtype=torch.int32).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(heads, n, dtype=torch.float32, device=q.device)
    grid = (heads, triton.cdiv(n, block))
    _block_sparse_kernel[grid](
        q, k, v, table, counts, out, lse, n, k.shape[1], dim, heads // k.shape[0],
        1.0 / math.sqrt(dim) if scale is None else scale,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        table.stride(0), table.stride(1), counts.stride(0), lse.stride(0),
        BLOCK=block, BLOCK_D=max(16, triton.next_power_of_2(dim)),
    )
    return out, lse
