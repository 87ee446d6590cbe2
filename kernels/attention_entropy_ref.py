"""Torch reference for :func:`agent_gravity.kernels.attention_entropy`: materialises each head's scores."""

from __future__ import annotations

import math

import torch


def default_positions(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """Queries are the last ``q_len`` tokens of the key sequence."""
    return torch.arange(k_len - q_len, k_len, device=device)


def attention_entropy_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Entropy (nats) of each query's attention over each key segment, per query head.

    ``q`` is ``[q_heads, n_queries, dim]``, ``k`` is ``[kv_heads, k_len, dim]`` with ``q_heads`` a
    multiple of ``kv_heads`` (grouped-query attention). ``positions[i]`` is query ``i``'s position
    among the keys (default: the last ``n_queries`` positions); with ``causal`` it sees keys up to
    and including it. ``segments`` is ``[n_segments, 2]`` of ``[start, end)`` key ranges (default:
    all keys); attention is renormalised within each. Returns ``[q_heads, n_queries, n_segments]``
    in fp32; a segment a query cannot see has entropy NaN.
    """
    q_heads, n_queries, dim = q.shape
    kv_heads, k_len, _ = k.shape
    positions = default_positions(n_queries, k_len, q.device) if positions is None else positions
    segments = torch.tensor([[0, k_len]], device=q.device) if segments is None else segments.clamp(0, k_len)
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    keys = torch.arange(k_len, device=q.device)
    out = torch.empty(q_heads, n_queries, segments.shape[0], dtype=torch.float32, device=q.device)
    for h in range(q_heads):
        scores = (q[h].float() @ k[h // (q_heads // kv_heads)].float().T) * scale  # [n_queries, k_len]
        for s, (start, end) in enumerate(segments.tolist()):
            visible = (keys >= start) & (keys < end)
            mask = visible[None, :].expand(n_queries, -1)
            if causal:
                mask = mask & (keys[None, :] <= positions[:, None])
            x = scores.masked_fill(~mask, float("-inf"))
            log_p = x - torch.logsumexp(x, dim=-1, keepdim=True)
            p = log_p.exp()
            entropy = -torch.where(mask, p * log_p, 0.0).sum(-1)
            out[h, :, s] = torch.where(mask.any(-1), entropy, float("nan"))
    return out
