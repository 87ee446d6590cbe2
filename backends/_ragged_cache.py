"""A KV cache with its own length per attention head, so that eviction really frees memory.

transformers' caches hold one ``[heads, seq, dim]`` tensor per layer: every head of a layer keeps
the same number of entries, so per-head budgets would have to be masked, not freed. This cache
keeps one ``[n_h, dim]`` tensor per key-value head (grouped-query layouts are stored per KV head)
and records the original position of each entry. For attention it lays the heads out padded,
for that call only, and the ``agent_gravity_ragged`` attention function masks the padding per head.
It also keeps the last ``window`` query vectors per layer: what trim policies score keys with.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

ATTENTION = "agent_gravity_ragged"
_ACTIVE: contextvars.ContextVar[RaggedCache | None] = contextvars.ContextVar("agent_gravity_ragged", default=None)


@dataclass
class HeadKV:
    """One key-value head's entries: post-RoPE keys, values and their original positions."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor

    def select(self, keep: torch.Tensor) -> HeadKV:
        """Only the entries at ``keep`` (sorted), as new tensors: the old ones can be freed."""
        keep = keep.sort().values
        return HeadKV(self.keys[keep].clone(), self.values[keep].clone(), self.positions[keep].clone())


@dataclass
class RaggedCache:
    """Per-layer, per-KV-head entries of different lengths; ``next_position`` continues the true sequence."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    window: int = 32
    heads: list[list[HeadKV]] = field(default_factory=list)
    queries: list[torch.Tensor | None] = field(default_factory=list)
    """Per layer, the last ``window`` query vectors ``[q_heads, w, dim]`` (post-RoPE)."""
    next_position: int = 0
    _masks: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.queries = [None] * self.num_layers
        self._masks = [None] * self.num_layers

    # -- what the model calls ----------------------------------------------------------------

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[1, kv_heads, q, dim]`` keys and values; return this call's padded layout."""
        q = key.shape[2]
        positions = torch.arange(self.next_position, self.next_position + q, device=key.device)
        if len(self.heads) <= layer_idx:
            self.heads.append([HeadKV(key[0, h].clone(), value[0, h].clone(), positions.clone())
                               for h in range(self.num_kv_heads)])
            self._masks[layer_idx] = None
            return key, value
        old = self.heads[layer_idx]
        lengths = [h.keys.shape[0] for h in old]
        width = max(lengths)
        keys = key.new_zeros(1, self.num_kv_heads, width + q, self.head_dim)
        values = torch.zeros_like(keys)
        for i, head in enumerate(old):
            n = lengths[i]
            keys[0, i, :n], values[0, i, :n] = head.keys, head.values
            keys[0, i, width:], values[0, i, width:] = key[0, i], value[0, i]
            old[i] = HeadKV(torch.cat([head.keys, key[0, i]]), torch.cat([head.values, value[0, i]]),
                            torch.cat([head.positions, positions]))
        self._masks[layer_idx] = _mask(lengths, width, q, key.device)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.next_position

    def advance(self, tokens: int) -> None:
        """The forward pass that fed ``tokens`` tokens is over."""
        self.next_position += tokens

    def remember_queries(self, layer_idx: int, query: torch.Tensor) -> None:
        """Keep the layer's last ``window`` query vectors (``query``: ``[1, q_heads, q, dim]``)."""
        last = query[0, :, -self.window:].detach()
        old = self.queries[layer_idx]
        self.queries[layer_idx] = last if old is None else torch.cat([old, last], dim=1)[:, -self.window:]

    def mask(self, layer_idx: int) -> torch.Tensor | None:
        """This call's additive mask ``[1, kv_heads, q, width + q]`` for the layer; None when heads are level."""
        return self._masks[layer_idx]

    # -- what trimming calls -------------------------------------------------------------------

    def crop(self, delta: int) -> None:
        """Drop every entry at or past position ``next_position + delta`` (``delta`` <= 0), and go back there."""
        target = self.next_position + delta
        for layer in self.heads:
            for i, head in enumerate(layer):
                layer[i] = head.select(torch.nonzero(head.positions < target).flatten())
        self.next_position = target

    def drop(self, start: int, end: int) -> None:
        """Free the entries of positions ``[start, end)`` in every head (``next_position`` stays)."""
        for layer in self.heads:
            for i, head in enumerate(layer):
                layer[i] = head.select(torch.nonzero((head.positions < start) | (head.positions >= end)).flatten())

    def keep(self, layer_idx: int, kept: Sequence[torch.Tensor]) -> None:
        """Keep only ``kept[h]`` (entry indices) in each KV head of a layer; the rest is freed."""
        self.heads[layer_idx] = [head.select(k) for head, k in zip(self.heads[layer_idx], kept)]

    def lengths(self) -> list[list[int]]:
        """Entries held per layer and KV head."""
        return [[h.keys.shape[0] for h in layer] for layer in self.heads]

    def nbytes(self) -> int:
        """Bytes the keys, values and positions really hold."""
        return sum(t.numel() * t.element_size() for layer in self.heads for h in layer
                   for t in (h.keys, h.values, h.positions))


def _mask(lengths: list[int], width: int, q: int, device: torch.device) -> torch.Tensor | None:
    """Padding between each head's entries and the new ones is hidden; the new ones are causal."""
    if all(n == width for n in lengths) and q == 1:
        return None
    mask = torch.zeros(1, len(lengths), q, width + q, device=device)
    for i, n in enumerate(lengths):
        mask[0, i, :, n:width] = float("-inf")
    mask[..., width:] = torch.triu(torch.full((q, q), float("-inf"), device=device), diagonal=1)
    return mask


class active:
    """Context in which the ragged attention function reads masks from ``cache``."""

    def __init__(self, cache: RaggedCache) -> None:
        self.cache = cache

    def __enter__(self) -> RaggedCache:
        self._token = _ACTIVE.set(self.cache)
        return self.cache

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._token)


def ragged_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over a RaggedCache's padded layout; with any other cache, transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = _ACTIVE.get()
    if cache is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layer = module.layer_idx
    cache.remember_queries(layer, query)
    groups = query.shape[1] // key.shape[1]
    mask = cache.mask(layer)
    if mask is not None:
        mask = mask.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=mask is None and query.shape[2] > 1, scale=scaling,
        enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``agent_gravity_ragged`` an attention implementation transformers can load models with."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, ragged_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
