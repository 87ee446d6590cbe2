"""Torch reference for :func:`agent_gravity.kernels.block_sparse_attention`: each query block gathers the key
blocks its table lists and attends over them, causally."""

from __future__ import annotations

import math

import torch


def block_sparse_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                                     counts: torch.Tensor, block: int, scale: float | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """See :func:`agent_gravity.kernels.block_sparse_attention`; one query block at a time, in fp32."""
    heads, n, dim = q.shape
    keys, group = k.shape[1], heads // k.shape[0]
    offset = keys - n
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = torch.zeros(heads, n, dim, dtype=torch.float32, device=q.device)
    lse = torch.full((heads, n), -math.inf, dtype=torch.float32, device=q.device)
    for h in range(heads):
        for qb in range(math.ceil(n / block)):
            rows = torch.arange(qb * block, min((qb + 1) * block, n), device=q.device)
            listed = table[h, qb, :int(counts[h, qb])].long()
            ids = (listed[:, None] * block + torch.arange(block, device=q.device)).flatten()
            ids = ids[ids < keys]
            scores = q[h, rows].float() @ k[h // group, ids].float().T * scale
            scores.masked_fill_(ids[None, :] > (offset + rows)[:, None], -math.inf)
            row_lse = torch.logsumexp(scores, -1)
            seen = torch.isfinite(row_lse)
            weights = torch.exp(scores - torch.where(seen, row_lse, 0)[:, None])
            out[h, rows] = weights @ v[h // group, ids].float()
            lse[h, rows] = row_lse
    return out.to(q.dtype), lse
