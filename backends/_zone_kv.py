"""KV quantization after the lock, during decode: entries written inside a gravity zone go to 8 or 4 bits.

As the decode loop writes entries, those of output positions that lie in a gravity zone (a stretch of
``window`` tokens whose mean next-token entropy is under the zone's threshold) and are older than the
``recent`` full-precision window are stored in fewer bits (KIVI keeps such a residual window too). Packing
runs once ``every`` new positions have left the window, so its cost is paid in batches. The report's bytes
are read from what the cache holds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agent_gravity.backends._ragged_cache import RaggedCache
from agent_gravity.trim.gravity_zone import GravityZone


@dataclass(frozen=True)
class ZoneKVSpec:
    """``bits`` per stored value (8 or 4); ``recent`` newest entries stay at full precision; pack every
    ``every`` positions."""

    bits: int = 8
    recent: int = 32
    every: int = 16


@dataclass
class ZoneKVReport:
    """What zone quantization did in one call: entries packed (over every layer and KV head), the bytes those
    entries hold now and held at full precision, and the output positions packed (``at``)."""

    bits: int
    entries: int = 0
    bytes_held: int = 0
    bytes_full: int = 0
    at: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        ratio = self.bytes_full / self.bytes_held if self.bytes_held else None
        return {**asdict(self), "bytes_ratio": ratio}


class ZonePacker:
    """Packs one decode loop's zone entries as they leave the recent window."""

    def __init__(self, spec: ZoneKVSpec, zone: GravityZone, start: int) -> None:
        self.spec, self.zone = spec, zone
        self._done = start
        """Output positions before this one were examined (the first is the prompt's end)."""
        self._start = start
        self.report = ZoneKVReport(spec.bits)

    def step(self, cache: RaggedCache, decided: int, final: bool = False) -> None:
        """``decided`` positions hold decided tokens; pack the zone entries among them outside the recent window
        (``final``: whatever is due, however few)."""
        end = decided - self.spec.recent
        if end <= self._done or (end - self._done < self.spec.every and not final):
            return
        # Windows that straddle the last boundary are looked at again: a position already packed stays packed.
        positions = self.zone.positions(cache.entropy, max(self._start, self._done - self.zone.patience + 1), end)
        if positions.numel():
            cache.quantize(positions, self.spec.bits)
        self._done = end

    def close(self, cache: RaggedCache) -> ZoneKVReport:
        """The report, read from the cache: packed entries of this width from the prompt's end on."""
        entries = held = full = 0
        element = cache.heads[0][0].keys.element_size() if cache.heads else 0
        positions: set[int] = set()
        stores = (s for layer in cache.heads for head in layer for s in head.packed
                  if s.bits == self.spec.bits and not s.key_blocks)  # zones pack keys a scale per entry
        for store in stores:
            mine = store.positions[store.positions >= self._start]
            entry = sum(t[:1].numel() * t.element_size() for t in store.tensors())  # every tensor holds a row each
            entries += mine.numel()
            held += mine.numel() * entry
            full += mine.numel() * (2 * cache.head_dim * element + store.positions.element_size())
            positions.update(mine.tolist())
        self.report.entries, self.report.bytes_held, self.report.bytes_full = entries, held, full
        self.report.at = sorted(p - self._start for p in positions)
        return self.report
