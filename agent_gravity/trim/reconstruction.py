"""Query-agnostic trimming by context reconstruction (KVzip's idea on our cache): an entry is worth what
the model reads of it while repeating its own context, so facts a later question may ask about stay
even though no recent query looked at them. The budget goes to the highest-scoring entries whichever
KV head, and by default whichever layer, holds them (scores are attention probabilities, comparable
across heads and layers): heads and layers that rebuild the context from a few entries give budget
to those that need many, as KVzip's non-uniform budgets do."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from agent_gravity._limits import MAX_POOL, bounded
from agent_gravity.trim.base import Budget, LayerStretch, Reconstruction, TrimBudgetError, pooled


@dataclass(frozen=True)
class ReconstructionPolicy:
    """Keeps the entries the model attends to most while re-reading its context; the total budget is shared
    across KV heads (and, with ``share="model"``, across layers) by score."""

    name: str = "reconstruction"
    chunk: int = 512
    """Context tokens re-read per pass (each pass is the instruction plus one chunk)."""
    pool: int = 1
    protect: bool = True
    recent: bool = True
    """Output-aware: the attention of the latest tokens read or written (the model's own answer when it wrote
    last) scores entries too, beside the reconstruction; False scores by the reconstruction alone."""
    share: Literal["model", "layer"] = "model"
    """Where the budget is pooled: the whole model's stretch, or each layer's own."""

    def __post_init__(self) -> None:
        bounded("pool", self.pool, 1, MAX_POOL)
        if self.share not in ("model", "layer"):
            raise ValueError(f"share must be 'model' or 'layer', got {self.share!r}")
        self.reconstruction  # noqa: B018 - Reconstruction checks the chunk, once for both

    @property
    def reconstruction(self) -> Reconstruction:
        return Reconstruction(chunk=self.chunk, recent=self.recent)

    def _scores(self, stretch: LayerStretch) -> list[torch.Tensor]:
        """Per KV head, each stretch entry's score: pooled, protected entries infinite."""
        if stretch.importance is None:
            raise TrimBudgetError("the reconstruction policy needs entry scores from a reconstruction pass; trim on "
                                  "a backend that runs one (the transformers backend)")
        scores = [pooled(s, self.pool) for s in stretch.importance]
        if self.protect and stretch.protected.numel():
            scores = [torch.where(torch.isin(p, stretch.protected), math.inf, s)
                      for s, p in zip(scores, stretch.positions)]
        return scores

    @property
    def layer_budgets(self) -> Callable[[Sequence[LayerStretch], Budget], list[Budget]] | None:
        """How the model's budget is split among layers; None with ``share="layer"``, so that a backend trims one
        layer at a time without holding every layer's stretch."""
        return self._model_budgets if self.share == "model" else None

    def _model_budgets(self, stretches: Sequence[LayerStretch], budget: Budget) -> list[Budget]:
        """Each layer's share of the model's budget (the sum of every head's): as many entries as it holds among
        the model's best."""
        scores = [torch.cat([*self._scores(s), torch.zeros(0)]) for s in stretches]
        flat = torch.cat(scores)
        total = min(flat.numel(), sum(budget.layer_total(s) for s in stretches))
        layer = torch.repeat_interleave(torch.arange(len(scores)), torch.tensor([s.numel() for s in scores]))
        counts = torch.bincount(layer[torch.topk(flat, total).indices], minlength=len(scores))
        return [Budget(budget.ratio, int(c)) for c in counts]

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        scores = self._scores(stretch)
        total = max(budget.layer_total(stretch), sum(int(torch.isinf(s).sum()) for s in scores))
        flat = torch.cat(scores)
        chosen = torch.zeros(flat.numel(), dtype=torch.bool)
        chosen[torch.topk(flat, min(total, flat.numel())).indices] = True
        return [torch.nonzero(part).flatten() for part in chosen.split([s.numel() for s in scores])]
