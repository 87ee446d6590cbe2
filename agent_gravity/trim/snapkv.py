"""SnapKV as a trim policy: keep the stretch entries the recent queries attend to most, per KV head,
with an even budget for every head. A baseline: query-aware, so it can drop what later turns ask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent_gravity._limits import MAX_POOL, bounded
from agent_gravity.trim.base import Budget, LayerStretch, group_scores, pick


@dataclass(frozen=True)
class SnapKVPolicy:
    """Top entries by pooled attention from the observation window, ``budget`` per head."""

    name: str = "snapkv"
    pool: int = 7
    protect: bool = False

    def __post_init__(self) -> None:
        bounded("pool", self.pool, 1, MAX_POOL)

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        protected = stretch.protected if self.protect else None
        return [pick(scores, budget.per_head(p.numel()), p, protected)
                for p, scores in zip(stretch.positions, group_scores(stretch, self.pool))]
