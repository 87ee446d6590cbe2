"""Entropy-guided, head-aware trimming: attention entropy, measured in this context, tells rigid heads
from dynamic ones (EntropyInfer). A rigid head keeps only a short recent stretch; a dynamic head keeps
the entries the recent queries score highest, and receives the budget the rigid heads free. Budgets
stay per KV head (never the layer's maximum), grouped-query heads are scored over their whole group,
and exact values are protected."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agent_gravity._limits import MAX_POOL, bounded
from agent_gravity.kernels import attention_entropy
from agent_gravity.trim.base import Budget, LayerStretch, group_scores, pick


@dataclass(frozen=True)
class HeadEntropyPolicy:
    """Per-head budgets from attention entropy: rigid heads give budget to dynamic heads."""

    name: str = "head_entropy"
    rigid_below: float = 0.25
    """Normalised attention entropy (entropy / log of the keys seen) under which a head counts as rigid."""
    rigid_share: float = 0.25
    """A rigid head keeps this share of its even budget; the rest goes to the dynamic heads."""
    pool: int = 7
    protect: bool = True

    def __post_init__(self) -> None:
        bounded("rigid_below", self.rigid_below, 0, 1)
        bounded("rigid_share", self.rigid_share, 0, 1)
        bounded("pool", self.pool, 1, MAX_POOL)

    def rigidity(self, stretch: LayerStretch) -> list[float]:
        """Mean normalised attention entropy of each KV head's query group over its stretch (0 rigid, 1 flat)."""
        q = stretch.queries
        assert q is not None
        groups = q.shape[0] // stretch.kv_heads
        out = []
        for h, keys in enumerate(stretch.keys):
            n = keys.shape[0]
            if n < 2:
                out.append(0.0)
                continue
            entropy = attention_entropy(q[h * groups:(h + 1) * groups], keys[None], causal=False)
            out.append(float(entropy.nanmean()) / math.log(n))
        return out

    def budgets(self, stretch: LayerStretch, budget: Budget, rigid: list[bool]) -> list[int]:
        """Each head's own budget; the layer's total equals the even split's total."""
        even = [budget.per_head(p.numel()) for p in stretch.positions]
        if all(rigid) or not any(rigid):
            return even
        mine = [max(1, math.floor(e * self.rigid_share)) if r else e for e, r in zip(even, rigid)]
        spare = sum(even) - sum(mine)
        dynamic = [i for i, r in enumerate(rigid) if not r]
        room = sum(even[i] for i in dynamic)
        for i in dynamic:
            mine[i] = min(stretch.positions[i].numel(), mine[i] + round(spare * even[i] / room))
        return mine

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        protected = stretch.protected if self.protect else None
        rigid = [r < self.rigid_below for r in self.rigidity(stretch)]
        return [pick(p.float() if is_rigid else scores, k, p, protected)  # rigid: the most recent entries
                for p, scores, k, is_rigid in zip(stretch.positions, group_scores(stretch, self.pool),
                                                  self.budgets(stretch, budget, rigid), rigid)]
