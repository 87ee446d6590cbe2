"""StreamingLLM as a trim policy: of the stretch, keep only its most recent entries (the sinks and the
window are kept around every stretch anyway). A baseline: it forgets everything in the middle."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agent_gravity.trim.base import Budget, LayerStretch, pick


@dataclass(frozen=True)
class StreamingLLMPolicy:
    """Sinks plus a recent window: of each head's stretch, the latest ``budget`` entries."""

    name: str = "streaming_llm"
    protect: bool = False
    """Keep exact values too (off: the baseline as published)."""

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        protected = stretch.protected if self.protect else None
        return [pick(p.float(), budget.per_head(p.numel()), p, protected) for p in stretch.positions]
