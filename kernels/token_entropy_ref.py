"""Torch reference for :func:`agent_gravity.kernels.token_entropy`: the same signature, plain ops."""

from __future__ import annotations

import torch

from agent_gravity.kernels.token_stats import TokenStats

# Masked entries have log p = -inf; clamped here, p * log p and p * (log p)^2 are exactly 0 for them
# (p underflows to 0 long before log p reaches this), with no NaN and no extra masking pass.
_LOG_P_FLOOR = -1e4


def token_entropy_reference(
    logits: torch.Tensor, rows: torch.Tensor | None = None, out: TokenStats | None = None
) -> TokenStats:
    """Entropy, varentropy, top-1 probability, margin and top-1 id of each row of ``[rows, vocab]`` logits."""
    x = (logits if rows is None else logits.index_select(0, rows)).float()
    top = x.topk(min(2, x.shape[-1]), dim=-1)
    log_p = torch.log_softmax(x, dim=-1)
    top_log_p = log_p.gather(-1, top.indices)
    p = log_p.exp()
    log_p.clamp_(min=_LOG_P_FLOOR)
    p_log_p = p.mul_(log_p)
    entropy = -p_log_p.sum(-1)
    top_p = top_log_p.exp()
    second = top_p[:, 1] if x.shape[-1] > 1 else torch.zeros_like(entropy)
    result = TokenStats(
        entropy=entropy,
        varentropy=(p_log_p.mul_(log_p).sum(-1) - entropy * entropy).clamp_min(0.0),
        top_prob=top_p[:, 0],
        margin=top_p[:, 0] - second,
        top_id=top.indices[:, 0],
    )
    if out is None:
        return result
    for name in ("entropy", "varentropy", "top_prob", "margin", "top_id"):
        getattr(out, name).copy_(getattr(result, name))
    return out
