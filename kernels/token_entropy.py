"""Exact next-token entropy from full logits (torch reference implementation)."""

from __future__ import annotations

import torch


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Return the entropy in nats of each row of a ``[rows, vocab]`` logits tensor.

    Computed in fp32 whatever the input dtype. Entries equal to ``-inf`` are masked
    out; a row with a single finite entry has entropy 0.
    """
    if logits.dim() != 2:
        raise ValueError(f"token_entropy expects [rows, vocab] logits, got shape {tuple(logits.shape)}")
    x = logits.float()
    log_z = torch.logsumexp(x, dim=-1, keepdim=True)
    log_p = x - log_z
    p = log_p.exp()
    # p * log_p is 0 * -inf = nan on masked entries; they contribute nothing.
    plogp = torch.where(p > 0, p * log_p, torch.zeros_like(p))
    return -plogp.sum(dim=-1)
