"""Query-agnostic trimming by context reconstruction (KVzip's idea on our cache): an entry is worth what
the model reads of it while repeating its own context, so facts a later question may ask about stay
even though no recent query looked at them. The layer's budget goes to its highest-scoring entries
whichever KV head holds them (scores are attention probabilities, comparable across heads): heads
that rebuild the context from a few entries give budget to heads that need many."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agent_gravity._limits import MAX_POOL, bounded
from agent_gravity.trim.base import Budget, LayerStretch, Reconstruction, TrimBudgetError, pooled


@dataclass(frozen=True)
class ReconstructionPolicy:
    """Keeps the entries the model attends to most while re-reading its context; the layer's total budget
    is shared across its KV heads by score."""

    name: str = "reconstruction"
    chunk: int = 512
    """Context tokens re-read per pass (each pass is the instruction plus one chunk)."""
    pool: int = 1
    protect: bool = True
    recent: bool = False
    """Output-aware: the attention of the latest tokens read or written (the model's own answer when it wrote
    last) scores entries too, beside the reconstruction."""

    def __post_init__(self) -> None:
        bounded("pool", self.pool, 1, MAX_POOL)
        self.reconstruction  # noqa: B018 - Reconstruction checks the chunk, once for both

    @property
    def reconstruction(self) -> Reconstruction:
        return Reconstruction(chunk=self.chunk, recent=self.recent)

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        if stretch.importance is None:
            raise TrimBudgetError("the reconstruction policy needs entry scores from a reconstruction pass; trim on "
                                  "a backend that runs one (the transformers backend)")
        scores = [pooled(s, self.pool) for s in stretch.importance]
        if self.protect and stretch.protected.numel():
            scores = [torch.where(torch.isin(p, stretch.protected), math.inf, s)
                      for s, p in zip(scores, stretch.positions)]
        total = sum(budget.per_head(p.numel()) for p in stretch.positions if p.numel())
        total = max(total, sum(int(torch.isinf(s).sum()) for s in scores))
        flat = torch.cat(scores)
        chosen = torch.zeros(flat.numel(), dtype=torch.bool)
        chosen[torch.topk(flat, min(total, flat.numel())).indices] = True
        return [torch.nonzero(part).flatten() for part in chosen.split([s.numel() for s in scores])]
