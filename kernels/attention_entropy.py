"""``attention_entropy``: per-head attention entropy in tiles, Triton on CUDA, torch elsewhere."""

from __future__ import annotations

import torch

from agent_gravity.kernels.attention_entropy_ref import attention_entropy_reference
from agent_gravity.kernels.token_entropy import Impl, resolve_impl


def attention_entropy(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None = None,
    segments: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
    impl: Impl = "auto",
) -> torch.Tensor:
    """Entropy (nats) of each query's attention over each key segment, per query head.

    ``q`` ``[q_heads, n_queries, dim]``; ``k`` ``[kv_heads, k_len, dim]`` (grouped-query attention
    when ``q_heads`` is a multiple of ``kv_heads``). ``positions``: each query's position among the
    keys (default: the last ``n_queries``). ``segments``: ``[n_segments, 2]`` ``[start, end)`` key
    ranges, attention renormalised within each (default: all keys). Returns
    ``[q_heads, n_queries, n_segments]`` fp32; NaN where a query sees no key of a segment.
    Near-zero entropy in every segment marks a rigid head; the KV trimming policies use this.
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[2] != k.shape[2]:
        raise ValueError(f"attention_entropy expects q [heads, queries, dim] and k [kv_heads, keys, dim] "
                         f"with equal dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[0] % k.shape[0]:
        raise ValueError(f"{q.shape[0]} query heads cannot share {k.shape[0]} KV heads evenly")
    if resolve_impl(impl, q.device) == "torch":
        return attention_entropy_reference(q, k, positions, segments, causal, scale)
    from agent_gravity.kernels.attention_entropy_triton import attention_entropy_triton

    return attention_entropy_triton(q, k, positions, segments, causal, scale)
