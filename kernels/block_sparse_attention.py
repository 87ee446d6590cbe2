"""``block_sparse_attention``: causal attention over a table of key blocks per query block, Triton on CUDA,
torch elsewhere. The GPU path of entropy-adaptive prefill: a dense head lists every block up to its diagonal,
a rigid head its sinks, chosen blocks and local window, and both run in one launch."""

from __future__ import annotations

import torch

from agent_gravity.kernels.block_sparse_attention_ref import block_sparse_attention_reference
from agent_gravity.kernels.token_entropy import Impl, resolve_impl


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor,
                           counts: torch.Tensor, block: int, scale: float | None = None,
                           impl: Impl = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of each query block over the key blocks its table lists, causal by position.

    ``q`` ``[heads, n, dim]`` holds the last ``n`` positions of ``k``/``v`` ``[kv_heads, keys, dim]``
    (grouped-query heads when ``heads`` is a multiple of ``kv_heads``). Query block ``j`` is rows
    ``[j * block, (j + 1) * block)``; ``table`` ``[heads, query_blocks, width]`` lists, per head and
    query block, the key blocks (ids of ``block`` keys each) it attends to in its first
    ``counts[head, query_block]`` slots, each id once. Returns the output ``[heads, n, dim]`` (q's
    dtype) and each row's log-sum-exp ``[heads, n]`` fp32 (-inf where a row saw no key), so passes
    over disjoint keys merge exactly.
    """
    if q.dim() != 3 or k.shape != v.shape or k.dim() != 3 or q.shape[2] != k.shape[2]:
        raise ValueError(f"block_sparse_attention expects q [heads, n, dim] and k, v [kv_heads, keys, dim] with "
                         f"equal dim, got {tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}")
    heads, n, _ = q.shape
    if heads % k.shape[0] or n > k.shape[1]:
        raise ValueError(f"{heads} query heads over {k.shape[0]} KV heads, {n} queries over {k.shape[1]} keys: "
                         "heads must share KV heads evenly and the queries be the last of the keys")
    blocks = -(-n // block)
    if table.shape[:2] != (heads, blocks) or counts.shape != (heads, blocks):
        raise ValueError(f"table must be [{heads}, {blocks}, width] and counts [{heads}, {blocks}] for {n} queries "
                         f"in blocks of {block}; got {tuple(table.shape)} and {tuple(counts.shape)}")
    if resolve_impl(impl, q.device) == "torch":
        return block_sparse_attention_reference(q, k, v, table, counts, block, scale)
    from agent_gravity.kernels.block_sparse_attention_triton import block_sparse_attention_triton

    return block_sparse_attention_triton(q, k, v, table, counts, block, scale)
