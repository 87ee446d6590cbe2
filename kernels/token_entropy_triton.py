"""Triton kernel for :func:`agent_gravity.kernels.token_entropy`: one read of the logits, nothing
vocab-sized written back.

Each program streams one slice of one row through an online log-sum-exp that also carries the
first and second moments of the shifted logits and the top-2 logits. A second, tiny kernel merges
the slices of each row. Splitting a row over several programs keeps the GPU busy when a decode
batch has only a few rows.
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from agent_gravity.kernels.token_stats import N_PARTIALS, TokenStats

BLOCK = 4096


@triton.jit
def _rescale(m, s0, s1, s2, m_new):
    """Re-express moments taken around ``m`` around ``m_new`` (>= m)."""
    scale = tl.where(s0 > 0, tl.exp(m - m_new), 0.0)
    # A shift so large that the old terms vanish must not meet them as 0 * inf.
    d = tl.where(scale > 0, m_new - m, 0.0)
    return scale * s0, scale * (s1 - d * s0), scale * (s2 - 2.0 * d * s1 + d * d * s0)


@triton.jit
def _partial_kernel(logits_ptr, stride_row, rows_ptr, n_cols, split_size, part_ptr,
                    HAS_ROWS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    r = tl.program_id(0)
    split = tl.program_id(1)
    if HAS_ROWS:
        row = tl.load(rows_ptr + r).to(tl.int64)
    else:
        row = r.to(tl.int64)
    base = logits_ptr + row * stride_row
    start = split * split_size
    end = tl.minimum(start + split_size, n_cols)
    lanes = tl.arange(0, BLOCK_SIZE)
    m = tl.full((), float("-inf"), tl.float32)
    s0 = tl.full((), 0.0, tl.float32)
    s1 = tl.full((), 0.0, tl.float32)
    s2 = tl.full((), 0.0, tl.float32)
    t1 = tl.full((), float("-inf"), tl.float32)
    t2 = tl.full((), float("-inf"), tl.float32)
    t1_idx = tl.full((), 0, tl.int32)
    for off in range(start, end, BLOCK_SIZE):
        idx = off + lanes
        x = tl.load(base + idx, mask=idx < end, other=float("-inf")).to(tl.float32)
        b1 = tl.max(x, axis=0)
        b1_at = tl.argmax(x, axis=0)
        b2 = tl.max(tl.where(lanes == b1_at, float("-inf"), x), axis=0)
        t2 = tl.maximum(tl.maximum(tl.minimum(t1, b1), t2), b2)
        t1_idx = tl.where(b1 > t1, off + b1_at, t1_idx)
        t1 = tl.maximum(t1, b1)
        m_new = tl.maximum(m, b1)
        s0, s1, s2 = _rescale(m, s0, s1, s2, m_new)
        m = m_new
        y = x - tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp(y)
        ey = tl.where(e > 0, e * y, 0.0)
        s0 += tl.sum(e, axis=0)
        s1 += tl.sum(ey, axis=0)
        s2 += tl.sum(tl.where(e > 0, ey * y, 0.0), axis=0)
    out = part_ptr + (r * tl.num_programs(1) + split) * 7
    tl.store(out + 0, m)
    tl.store(out + 1, s0)
    tl.store(out + 2, s1)
    tl.store(out + 3, s2)
    tl.store(out + 4, t1)
    tl.store(out + 5, t2)
    tl.store(out + 6, t1_idx.to(tl.float32))


@triton.jit
def _combine_kernel(part_ptr, n_splits, entropy_ptr, varentropy_ptr, top_prob_ptr, margin_ptr,
                    top_id_ptr, SPLITS: tl.constexpr):
    r = tl.program_id(0)
    lanes = tl.arange(0, SPLITS)
    live = lanes < n_splits
    part = part_ptr + (r * n_splits + lanes) * 7
    m = tl.load(part + 0, mask=live, other=float("-inf"))
    s0 = tl.load(part + 1, mask=live, other=0.0)
    s1 = tl.load(part + 2, mask=live, other=0.0)
    s2 = tl.load(part + 3, mask=live, other=0.0)
    t1 = tl.load(part + 4, mask=live, other=float("-inf"))
    t2 = tl.load(part + 5, mask=live, other=float("-inf"))
    t1_idx = tl.load(part + 6, mask=live, other=0.0)
    big = tl.max(m, axis=0)
    s0, s1, s2 = _rescale(m, s0, s1, s2, big)
    total0, total1, total2 = tl.sum(s0, axis=0), tl.sum(s1, axis=0), tl.sum(s2, axis=0)
    mean = total1 / total0
    best = tl.argmax(t1, axis=0)
    second = tl.maximum(tl.max(tl.where(lanes == best, float("-inf"), t1), axis=0), tl.max(t2, axis=0))
    top_idx = tl.sum(tl.where(lanes == best, t1_idx, 0.0), axis=0)
    tl.store(entropy_ptr + r, tl.log(total0) - mean)
    tl.store(varentropy_ptr + r, tl.maximum(total2 / total0 - mean * mean, 0.0))
    tl.store(top_prob_ptr + r, 1.0 / total0)
    tl.store(margin_ptr + r, (1.0 - tl.exp(second - big)) / total0)
    tl.store(top_id_ptr + r, top_idx.to(tl.int64))


def token_entropy_triton(logits, rows=None, out: TokenStats | None = None, splits: int | None = None) -> TokenStats:
    """Triton implementation; see :func:`agent_gravity.kernels.token_entropy`."""
    import torch

    n_rows = logits.shape[0] if rows is None else rows.shape[0]
    n_cols = logits.shape[1]
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = TokenStats.empty(n_rows, logits.device) if out is None else out
    if splits is None:
        splits = _default_splits(n_rows, logits.device)
    splits = max(1, min(splits, triton.cdiv(n_cols, BLOCK)))
    split_size = triton.cdiv(triton.cdiv(n_cols, splits), BLOCK) * BLOCK
    splits = triton.cdiv(n_cols, split_size)
    workspace = out.workspace
    if workspace is None or workspace.numel() < n_rows * splits * N_PARTIALS:
        workspace = torch.empty(n_rows * splits * N_PARTIALS, dtype=torch.float32, device=logits.device)
    rows_arg = rows if rows is not None else workspace  # any pointer when HAS_ROWS is false
    _partial_kernel[(n_rows, splits)](logits, logits.stride(0), rows_arg, n_cols, split_size, workspace,
                                      HAS_ROWS=rows is not None, BLOCK_SIZE=BLOCK)
    _combine_kernel[(n_rows,)](workspace, splits, out.entropy, out.varentropy, out.top_prob, out.margin,
                               out.top_id, SPLITS=triton.next_power_of_2(splits))
    return out


def _default_splits(n_rows: int, device) -> int:
    """Enough programs to fill the GPU about four times over."""
    if device.type != "cuda":
        return 1
    return max(1, (4 * _multiprocessors(device.index)) // max(n_rows, 1))


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int | None) -> int:
    """SM count of a CUDA device, asked once: this runs on every decode step."""
    import torch

    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()
                                            ).multi_processor_count
