"""Entropy-gated KV quantization: what the model read or wrote inside a gravity zone is stored in 8 bits.

A gravity zone is a stretch over which the rolling mean of next-token entropy stays under a
threshold: the model saw each of its tokens coming (log templates it has read many times, an
answer that has locked in). Its entries are cheap to approximate, so they are kept in 8 bits
instead of being evicted; the tokens that surprised the model (the codes, ids and numbers later
turns ask for) stay at full precision and go to the trim policies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agent_gravity.trim.base import TrimBudgetError


@dataclass(frozen=True)
class GravityZone:
    """Positions inside stretches of ``patience`` tokens whose mean entropy is under ``threshold`` nats."""

    threshold: float = 0.5
    patience: int = 8

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise TrimBudgetError(f"gravity zone threshold must be a positive number of nats, got {self.threshold}")
        if self.patience < 1:
            raise TrimBudgetError(f"gravity zone patience must be at least 1 token, got {self.patience}")

    def positions(self, entropy: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Sorted positions in ``[start, end)`` that lie in a gravity zone (``entropy``: one value per
        position, NaN where unknown, which never counts as low)."""
        start, end = max(start, 0), min(end, entropy.numel())
        n = end - start
        if n < self.patience:
            return torch.zeros(0, dtype=torch.long)
        e = torch.nan_to_num(entropy[start:end].float(), nan=math.inf)
        means = e.unfold(0, self.patience, 1).mean(dim=1)   # window i covers [i, i + patience)
        low = (means < self.threshold).float()
        # A position is in the zone when any window that covers it is low.
        covered = torch.nn.functional.max_pool1d(
            torch.nn.functional.pad(low[None, None], (self.patience - 1, self.patience - 1)),
            self.patience, stride=1)[0, 0]
        return torch.nonzero(covered > 0).flatten() + start

    def holds(self, entropy: torch.Tensor) -> bool:
        """Whether the last ``patience`` values of ``entropy`` are all known and their mean is under the threshold:
        the test a decode loop makes at each step before acting inside a zone."""
        last = entropy[-self.patience:]
        return (last.numel() == self.patience and bool(torch.isfinite(last).all())
                and float(last.mean()) < self.threshold)
