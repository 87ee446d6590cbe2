"""A KV cache with its own length per attention head, so that eviction really frees memory.

transformers' caches hold one ``[heads, seq, dim]`` tensor per layer: every head of a layer keeps
the same number of entries, so per-head budgets would have to be masked, not freed. This cache
keeps one ``[n_h, dim]`` tensor per key-value head (grouped-query layouts are stored per KV head)
and records the original position of each entry. For attention it lays the heads out padded,
for that call only, and the ``agent_gravity_ragged`` attention function masks the padding per head.
It also keeps the last ``window`` query vectors per layer: what trim policies score keys with.

Entries can be stored in 8 or 4 bits (``quantize``): symmetric, per head. Values take one scale per entry
(8 bits) or per 32 values (4 bits); keys take the same, or (``key_block``, what trims use) one scale per channel
over each block of entries packed together, KIVI's layout for keys, whose outlier channels a scale per entry
spreads over every other channel. They are dequantized into the padded layout of each call only, and attention
does not care about the order of entries (RoPE is applied before they are cached).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agent_gravity.backends._adaptive_prefill import active as prefill_active
from agent_gravity.backends._adaptive_prefill import prefill_attention
from agent_gravity.backends._reconstruction import observing

ATTENTION = "agent_gravity_ragged"
_ACTIVE: contextvars.ContextVar[RaggedCache | None] = contextvars.ContextVar("agent_gravity_ragged", default=None)


@dataclass
class PackedKV:
    """Entries stored in ``bits`` bits (8, or 4 with two to a byte): ``x ~ q * scale``, symmetric. Values take one
    scale per ``dim / groups`` values of each entry. Keys take the same when ``key_counts`` is None; otherwise
    ``key_scales`` is ``[blocks, dim]``, one scale per channel for each block of consecutive entries, and
    ``key_counts[b]`` says how many entries block ``b`` holds."""

    bits: int
    keys: torch.Tensor
    key_scales: torch.Tensor
    values: torch.Tensor
    value_scales: torch.Tensor
    positions: torch.Tensor
    key_counts: torch.Tensor | None = None

    @classmethod
    def pack(cls, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, bits: int = 8,
             key_block: int | None = None) -> PackedKV:
        """Pack ``[n, dim]`` keys and values; with ``key_block``, keys take a scale per channel per that many
        entries (the last block holds the rest)."""
        v, vs = quantize_rows(values, bits)
        if key_block is None:
            return cls(bits, *quantize_rows(keys, bits), v, vs, positions.clone())
        if type(key_block) is not int or key_block < 1:
            raise ValueError(f"a key block holds a whole number of entries, 1 or more, not {key_block}")
        blocks = keys.split(key_block)
        counts = torch.tensor([len(b) for b in blocks], dtype=torch.int32, device=keys.device)
        peaks = torch.stack([b.abs().amax(dim=0) for b in blocks]) if blocks else keys.new_zeros(0, keys.shape[1])
        scales = _scale(peaks, bits)
        return cls(bits, _codes(keys, scales.repeat_interleave(counts.long(), dim=0, output_size=len(keys)), bits),
                   scales, v, vs, positions.clone(), counts)

    def unpack(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[n, dim]`` in ``dtype``."""
        values = dequantize_rows(self.values, self.value_scales, self.bits, dtype)
        if self.key_counts is None:
            return dequantize_rows(self.keys, self.key_scales, self.bits, dtype), values
        scales = self.key_scales.to(dtype).repeat_interleave(self.key_counts.long(), dim=0, output_size=len(values))
        return _code_values(self.keys, self.bits).to(dtype) * scales, values

    def where(self, keep: torch.Tensor) -> PackedKV:
        """Only the entries where the boolean ``keep`` holds, as new tensors (emptied key blocks go)."""
        if self.key_counts is None:
            return PackedKV(self.bits, *(t[keep].clone() for t in self.tensors()))
        counts = self.key_counts.long()
        blocks = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
        kept = torch.bincount(blocks[keep], minlength=len(counts)).to(torch.int32)
        return PackedKV(self.bits, self.keys[keep].clone(), self.key_scales[kept > 0].clone(),
                        self.values[keep].clone(), self.value_scales[keep].clone(), self.positions[keep].clone(),
                        kept[kept > 0])

    @property
    def key_blocks(self) -> bool:
        """Whether keys take a scale per channel per block (else per entry, like values)."""
        return self.key_counts is not None

    def cat(self, other: PackedKV) -> PackedKV:
        """These entries, then ``other``'s (same width and key layout)."""
        assert other.bits == self.bits and other.key_blocks == self.key_blocks
        return PackedKV(self.bits, *(torch.cat([a, b]) for a, b in zip(self.tensors(), other.tensors())))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every tensor held (with per-channel keys, the block scales and counts are not one row per entry)."""
        rest = () if self.key_counts is None else (self.key_counts,)
        return self.keys, self.key_scales, self.values, self.value_scales, self.positions, *rest


GROUP = {8: None, 4: 32}
"""Values per scale, by bit width: 8 bits take one scale per entry; 4 bits one per 32 values (KIVI's group size
for its per-token values), or per entry when the head dimension is smaller."""
KEY_BLOCK = 64
"""Entries per key scale when keys take a scale per channel (trims): ``dim / 64`` scales per entry, so at this
model's 64 dimensions as many as one scale per entry at 8 bits, and half as many as 4 bits' per-entry groups."""


def quantize_rows(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization of ``[n, dim]`` rows in groups: the codes (int8, or uint8 holding two 4-bit codes)
    and the ``[n, groups]`` scales in ``x``'s dtype."""
    if bits not in GROUP:
        raise ValueError(f"KV entries can be stored in 8 or 4 bits, not {bits}")
    n, dim = x.shape
    group = GROUP[bits] if GROUP[bits] and dim % GROUP[bits] == 0 else dim
    scale = _scale(x.reshape(n, dim // group, group).abs().amax(dim=-1), bits)
    return _codes(x, scale.repeat_interleave(group, dim=1), bits), scale


def _scale(peak: torch.Tensor, bits: int) -> torch.Tensor:
    """The symmetric step that maps ``peak`` (largest magnitude) to the largest ``bits``-bit code."""
    return peak.clamp_min(torch.finfo(peak.dtype).tiny) / (2 ** (bits - 1) - 1)


def _codes(x: torch.Tensor, scale: torch.Tensor, bits: int) -> torch.Tensor:
    """``x / scale`` (same shape) rounded to ``bits``-bit codes: int8, or uint8 holding two 4-bit codes."""
    top = 2 ** (bits - 1) - 1
    codes = torch.round(x / scale).clamp(-top, top).to(torch.int16)
    if bits == 4:
        return ((codes[:, 0::2] & 0xF) | ((codes[:, 1::2] & 0xF) << 4)).to(torch.uint8)
    return codes.to(torch.int8)


def _code_values(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """The signed codes ``[n, dim]`` that ``_codes`` stored (two to a byte at 4 bits)."""
    if bits == 8:
        return codes
    wide = codes.to(torch.int16)
    low, high = wide & 0xF, (wide >> 4) & 0xF
    return torch.stack([low - 16 * (low > 7), high - 16 * (high > 7)], dim=-1).flatten(1)


def packed_share(head_dim: int, dtype: torch.dtype, bits: int, key_block: int | None = None) -> float:
    """Bytes of one entry (key, value, position) stored in ``bits`` bits over its bytes at full precision (with
    ``key_block``, in a full block)."""
    n = 1 if key_block is None else key_block
    rows = torch.zeros(n, head_dim, dtype=dtype)
    positions = torch.zeros(n, dtype=torch.long)
    packed = PackedKV.pack(rows, rows, positions, bits, key_block)
    return (sum(t.numel() * t.element_size() for t in packed.tensors())
            / (n * (2 * head_dim * rows.element_size() + positions.element_size())))


def dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``[n, dim]`` rows that ``quantize_rows`` stored as ``codes`` and ``scales``, in ``dtype``."""
    values = _code_values(codes, bits)
    n, dim = values.shape
    groups = scales.shape[-1]
    return (values.to(dtype).reshape(n, groups, dim // groups) * scales.to(dtype)[..., None]).reshape(n, dim)


@dataclass
class HeadKV:
    """One key-value head's entries: post-RoPE keys, values and their original positions at full
    precision, and those stored in fewer bits (``packed``: one store per bit width and key layout), which trims
    leave alone."""

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    packed: tuple[PackedKV, ...] = ()

    def select(self, keep: torch.Tensor) -> HeadKV:
        """Only the full-precision entries at ``keep`` (and every packed one), as new tensors: the old ones
        can be freed."""
        keep = keep.sort().values
        return HeadKV(self.keys[keep].clone(), self.values[keep].clone(), self.positions[keep].clone(), self.packed)

    def where(self, keep: Callable[[torch.Tensor], torch.Tensor]) -> HeadKV:
        """Only the entries whose positions pass ``keep`` (positions to a boolean mask), packed ones too."""
        head = self.select(torch.nonzero(keep(self.positions)).flatten())
        head.packed = tuple(store.where(keep(store.positions)) for store in self.packed)
        return head

    def quantize(self, positions: torch.Tensor, bits: int = 8, key_block: int | None = None) -> HeadKV:
        """Move the full-precision entries at ``positions`` to ``bits`` bits (keys with a scale per channel per
        ``key_block`` entries, when given); packed ones are never packed again. One store per width and key layout."""
        chosen = torch.isin(self.positions, positions)
        if not bool(chosen.any()):
            return self
        fresh = PackedKV.pack(self.keys[chosen], self.values[chosen], self.positions[chosen], bits, key_block)
        head = self.select(torch.nonzero(~chosen).flatten())
        same = [i for i, store in enumerate(self.packed) if (store.bits, store.key_blocks) == (bits, fresh.key_blocks)]
        head.packed = (tuple(s.cat(fresh) if i in same else s for i, s in enumerate(self.packed)) if same
                       else (*self.packed, fresh))
        return head

    def packed_positions(self) -> torch.Tensor:
        """Positions of the packed entries, store by store."""
        return torch.cat([s.positions for s in self.packed]) if self.packed else self.positions[:0]

    def layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every entry's keys and values at full precision, packed ones first (for one attention call)."""
        if not self.packed:
            return self.keys, self.values
        unpacked = [s.unpack(self.keys.dtype) for s in self.packed]
        return (torch.cat([*(k for k, _ in unpacked), self.keys]), torch.cat([*(v for _, v in unpacked), self.values]))

    def __len__(self) -> int:
        return self.keys.shape[0] + sum(s.keys.shape[0] for s in self.packed)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.keys, self.values, self.positions, *(t for s in self.packed for t in s.tensors()))


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
    entropy: torch.Tensor = field(default_factory=lambda: torch.full((1,), math.nan))
    """Per position, the entropy of the next-token distribution its token was read or sampled from (NaN
    for the first); one more than ``next_position``: the last is the pending token's."""
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
        lengths = [len(h) for h in old]
        width = max(lengths)
        keys = key.new_zeros(1, self.num_kv_heads, width + q, self.head_dim)
        values = torch.zeros_like(keys)
        for i, head in enumerate(old):
            n = lengths[i]
            keys[0, i, :n], values[0, i, :n] = head.layout()
            keys[0, i, width:], values[0, i, width:] = key[0, i], value[0, i]
            old[i] = HeadKV(torch.cat([head.keys, key[0, i]]), torch.cat([head.values, value[0, i]]),
                            torch.cat([head.positions, positions]), head.packed)
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
        self._keep_positions(lambda p: p < target)
        self.next_position = target
        self.entropy = self.entropy[:target + 1]

    def drop(self, start: int, end: int) -> None:
        """Free the entries of positions ``[start, end)`` in every head (``next_position`` stays)."""
        self._keep_positions(lambda p: (p < start) | (p >= end))

    def _keep_positions(self, keep: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for layer in self.heads:
            for i, head in enumerate(layer):
                layer[i] = head.where(keep)

    def quantize(self, positions: torch.Tensor, bits: int = 8, key_block: int | None = None) -> None:
        """Store the entries at ``positions`` in ``bits`` bits in every head (those already packed stay as they
        are); ``key_block`` as ``HeadKV.quantize``."""
        for layer in self.heads:
            for i, head in enumerate(layer):
                layer[i] = head.quantize(positions, bits, key_block)

    def record_entropy(self, start: int, entropy: torch.Tensor) -> None:
        """Entropies of the distributions read at positions ``start...``: each predicted the next position's token."""
        self.entropy = torch.cat([self.entropy[:start + 1], entropy.detach().float().cpu()])

    def keep(self, layer_idx: int, kept: Sequence[torch.Tensor]) -> None:
        """Keep only ``kept[h]`` (entry indices) in each KV head of a layer; the rest is freed."""
        self.heads[layer_idx] = [head.select(k) for head, k in zip(self.heads[layer_idx], kept)]

    def lengths(self) -> list[list[int]]:
        """Entries held per layer and KV head."""
        return [[len(h) for h in layer] for layer in self.heads]

    def packed(self) -> int:
        """Entries stored in fewer bits, over every layer and KV head."""
        return sum(s.keys.shape[0] for layer in self.heads for h in layer for s in h.packed)

    def packed_nbytes(self) -> tuple[int, int]:
        """Bytes the packed entries hold (codes, scales, block counts, positions), and what they held at full
        precision."""
        stores = [s for layer in self.heads for h in layer for s in h.packed]
        held = sum(t.numel() * t.element_size() for s in stores for t in s.tensors())
        element = self.heads[0][0].keys.element_size() if self.heads else 0
        full = sum(s.keys.shape[0] * (2 * self.head_dim * element + s.positions.element_size()) for s in stores)
        return held, full

    def nbytes(self) -> int:
        """Bytes the keys, values, scales, block counts and positions really hold."""
        return sum(t.numel() * t.element_size() for layer in self.heads for h in layer for t in h.tensors())


def _mask(lengths: list[int], width: int, q: int, device: torch.device) -> torch.Tensor | None:
    """Padding between each head's entries and the new ones is hidden; the new ones are causal."""
    if all(n == width for n in lengths) and q == 1:
        return None
    mask = torch.zeros(1, len(lengths), q, width + q, device=device)
    for i, n in enumerate(lengths):
        mask[0, i, :, n:width] = float("-inf")
    mask[..., width:] = torch.triu(torch.full((q, q), float("-inf"), device=device), diagonal=1)
    return mask


def unused_mask(device: torch.device | str) -> torch.Tensor:
    """What a model is handed as its attention mask under the ragged attention, which masks per head from the
    cache: a ready 4D mask makes transformers skip building its own, and one element is enough (a full
    ``[q, keys]`` mask would cost O(n^2) memory on long prompts)."""
    return torch.zeros(1, 1, 1, 1, device=device)


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
    if (scores := observing()) is not None:  # a reconstruction pass scoring the held entries
        scores.observe(layer, query, key, mask, scaling or query.shape[-1] ** -0.5)
    if mask is None and (adaptive := prefill_active(query.shape[2])) is not None:  # a fresh, long prefill
        return prefill_attention(query, key, value, scaling or query.shape[-1] ** -0.5, layer,
                                 *adaptive).transpose(1, 2).contiguous(), None
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
