"""The KV trim extension point: a policy picks, per layer and KV head, which entries of a stretch to keep.

A trim acts on one *stretch* of a session's cache: the entries written since the last trim, less
the recent ``window`` (always kept, it is what the next tokens attend to most). Entries before the
stretch were compressed already and are never compressed again; the ``sinks`` (the first tokens)
are always kept. Each policy returns, for every KV head of a layer, the indices of the stretch's
entries to keep, within that head's own budget: budgets stay per head.

A policy that scores by context reconstruction carries a ``reconstruction`` attribute (a
``Reconstruction``); the backend then runs that pass before trimming and hands each layer's entry
scores in ``LayerStretch.importance``. A policy whose scores compare across layers may also share
the model's budget among them: its ``layer_budgets(stretches, budget)`` (absent or None when it does not)
gives each layer its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from agent_gravity._errors import GravityError
from agent_gravity._limits import MAX_CHUNK, bounded


class TrimBudgetError(GravityError, ValueError):
    """A budget that cannot hold what every head must keep (the sinks and the recent window)."""


@dataclass(frozen=True)
class LayerStretch:
    """What a policy sees of one layer: each KV head's stretch, and the recent queries."""

    layer: int
    keys: Sequence[torch.Tensor]
    """Per KV head, the stretch's post-RoPE keys ``[n, dim]``."""
    positions: Sequence[torch.Tensor]
    """Per KV head, the stretch's original token positions ``[n]``."""
    queries: torch.Tensor | None
    """The layer's last query vectors ``[q_heads, w, dim]`` (grouped: ``q_heads`` is a multiple of KV heads)."""
    protected: torch.Tensor
    """Positions that must be kept (exact values); empty when nothing is protected."""
    importance: Sequence[torch.Tensor] | None = None
    """Per KV head, each stretch entry's score from a context reconstruction pass; None unless the policy
    carries a ``reconstruction``."""

    @property
    def kv_heads(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class Reconstruction:
    """How a backend scores entries by context reconstruction: after the cache, ``instruction`` and then the
    stretch's own tokens in chunks of ``chunk``, teacher forced; an entry scores the most attention it gets."""

    instruction: str = "\n\nRepeat the previous context exactly.\n\n"
    chunk: int = 512
    recent: bool = False
    """Let the cache's recent queries (a turn's own output when the model answered last) score entries too."""

    def __post_init__(self) -> None:
        bounded("chunk", self.chunk, 1, MAX_CHUNK)


@dataclass(frozen=True)
class Budget:
    """How many entries each KV head of a layer may keep of its stretch."""

    ratio: float
    """Keep about ``1 / ratio`` of the stretch (2x, 4x, 8x fewer entries)."""
    entries: int | None = None
    """The layer's entries in all, when a model-wide budget was shared among layers; None: ``ratio`` per head."""

    def per_head(self, n: int) -> int:
        return max(1, math.ceil(n / self.ratio))

    def layer_total(self, stretch: LayerStretch) -> int:
        """Entries the layer may keep of its stretch, over all its KV heads."""
        if self.entries is not None:
            return self.entries
        return sum(self.per_head(p.numel()) for p in stretch.positions if p.numel())


@runtime_checkable
class TrimPolicy(Protocol):
    """Picks the entries of a stretch to keep, per KV head. Implementations live one per file."""

    name: str

    def select(self, stretch: LayerStretch, budget: Budget) -> list[torch.Tensor]:
        """For each KV head, sorted indices into its stretch to keep: its budget, protected entries first."""
        ...


def pick(scores: torch.Tensor, k: int, positions: torch.Tensor, protected: torch.Tensor | None = None) -> torch.Tensor:
    """Sorted indices of ``k`` entries: every protected one first (never evicted), then the highest scores.
    Protected entries count against ``k``; only when they alone exceed it does a head keep more."""
    if protected is not None and protected.numel():
        scores = torch.where(torch.isin(positions, protected), torch.full_like(scores, math.inf), scores)
        k = max(k, int(torch.isinf(scores).sum()))
    return torch.topk(scores, min(k, scores.numel())).indices.sort().values


def group_scores(stretch: LayerStretch, pool: int = 7) -> list[torch.Tensor]:
    """SnapKV's score per KV head: the recent queries' attention to each stretch key, summed over the
    window and the head's query group, max-pooled over neighbouring keys (keeps spans whole)."""
    q = stretch.queries
    if q is None:
        raise TrimBudgetError("the layer has no recent queries to score keys with; run a turn before trimming")
    groups = q.shape[0] // stretch.kv_heads
    scale = q.shape[-1] ** -0.5
    out = []
    for h, keys in enumerate(stretch.keys):
        if keys.shape[0] == 0:
            out.append(keys.new_zeros(0))
            continue
        qs = q[h * groups:(h + 1) * groups]                       # [g, w, d]
        attn = torch.softmax(qs @ keys.T * scale, dim=-1)         # over the stretch only: relative weight
        out.append(pooled(attn.sum(dim=(0, 1)), pool))
    return out


def pooled(score: torch.Tensor, pool: int) -> torch.Tensor:
    """Max-pool scores over ``pool`` neighbouring entries, so a multi-token span scores as its best token."""
    if pool == 1 or score.numel() < 2:
        return score
    return torch.nn.functional.max_pool1d(score[None, None], pool, stride=1, padding=pool // 2)[0, 0][: score.numel()]
