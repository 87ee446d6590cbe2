"""Torch reference for :func:`agent_gravity.kernels.token_entropy`: the same signature, plain ops."""

from __future__ import annotations

import torch

from agent_gravity.kernels.token_stats import TokenStats


def token_entropy_reference(
    logits: torch.Tensor, rows: torch.Tensor | None = None, out: TokenStats | None = None
) -> TokenStats:
    """Entropy, varentropy, top-1 probability and margin of each row of ``[rows, vocab]`` logits."""
    x = (logits if rows is None else logits.index_select(0, rows)).float()
    top = x.topk(min(2, x.shape[-1]), dim=-1)
    m = top.values[:, :1]
    y = x - m
    e = y.exp()  # 0 where the logit is -inf
    live = e > 0
    s0 = e.sum(-1)
    mean = torch.where(live, e * y, 0.0).sum(-1) / s0
    second = top.values[:, 1] if x.shape[-1] > 1 else torch.full_like(s0, float("-inf"))
    result = TokenStats(
        entropy=s0.log() - mean,
        varentropy=(torch.where(live, e * y * y, 0.0).sum(-1) / s0 - mean * mean).clamp_min(0.0),
        top_prob=1.0 / s0,
        margin=(1.0 - (second - m[:, 0]).exp()) / s0,
        top_id=top.indices[:, 0],
    )
    if out is None:
        return result
    for name in ("entropy", "varentropy", "top_prob", "margin", "top_id"):
        getattr(out, name).copy_(getattr(result, name))
    return out
