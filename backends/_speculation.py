"""Lossless self-speculation inside gravity zones: drafts looked up in the context, checked in one pass.

While the full model's rolling next-token entropy stays under a threshold (a gravity zone), the decode
loop looks for the last few tokens earlier in the prompt and output (an n-gram match, as prompt-lookup
decoding does) and feeds the tokens that followed them as a draft, behind the next token, in one forward
pass. Where the context has no match, the model itself with some decoder layers skipped may draft instead
(self-speculation, as in LayerSkip and SWIFT); its cache entries are cropped before the check. Each fed position's logits are then sampled exactly as without a draft; a draft token is kept only
when the token sampled at its position equals it, and the first mismatch ends the draft (its cache
entries are cropped). Every emitted token is so drawn from the full model's own distribution at its
position, from the same random stream: the output is that of decoding without drafts, at any
temperature, up to the float rounding of a pass over several positions. Outside a zone nothing is
drafted, so uncertain stretches pay only the zone test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from agent_gravity.trim.gravity_zone import GravityZone


@dataclass(frozen=True)
class DraftSpec:
    """How much to draft inside a zone: up to ``max_draft`` tokens after the longest match of at most ``ngram``
    tokens; where the context offers none, the model itself without the decoder ``layers`` drafts (None: never)."""

    max_draft: int = 8
    ngram: int = 3
    layers: tuple[int, ...] | None = None


@dataclass
class SpeculationReport:
    """What drafting did in one call: tokens drafted and kept, the forward passes that carried a draft, and the
    output positions of the kept tokens."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    accepted_at: list[int] = field(default_factory=list)
    layer_drafted: int = 0
    """Of ``drafted``, the tokens the layer-skipped model drafted (each cost one pass through the kept layers)."""
    layer_accepted: int = 0

    def as_dict(self) -> dict[str, Any]:
        rate = self.accepted / self.drafted if self.drafted else None
        return {**asdict(self), "acceptance": rate}


def lookup(context: Sequence[int], ngram: int, tokens: int) -> list[int]:
    """Up to ``tokens`` tokens that followed the most recent earlier occurrence of the context's last ``n``
    tokens, for the largest ``n <= ngram`` that occurs earlier; [] when none does."""
    size = len(context)
    for n in range(min(ngram, size - 1), 0, -1):
        tail = list(context[size - n:])
        for start in range(size - n - 1, -1, -1):
            if context[start] == tail[0] and list(context[start:start + n]) == tail:
                return list(context[start + n:start + n + tokens])
    return []


class Drafter:
    """Drafts for one decode loop, with a draft length that follows the acceptance it measures: longer after a
    draft kept whole, shorter after a miss."""

    def __init__(self, spec: DraftSpec, zone: GravityZone) -> None:
        self.spec, self.zone = spec, zone
        self.length = max(1, spec.max_draft // 2)
        self.report = SpeculationReport()
        self._open: tuple[int, int, bool] | None = None  # the current draft: drafted, kept, by the layers

    def draft(self, context: Sequence[int], entropy: torch.Tensor, room: int,
              by_layers: Callable[[int], list[int]] | None = None) -> list[int]:
        """The tokens to feed after the next one (at most ``room``); [] outside a zone (``entropy``: the full
        model's, at the tokens decided so far). A context match comes first; without one, ``by_layers(n)`` (the
        layer-skipped model's next ``n`` tokens) when the spec names draft layers."""
        self.close()
        if room <= 0 or not self.zone.holds(entropy):
            return []
        n = min(self.length, room)
        drafted, layered = lookup(context, self.spec.ngram, n), False
        if not drafted and self.spec.layers and by_layers is not None:
            drafted, layered = by_layers(n), True
        if drafted:
            self._open = (len(drafted), 0, layered)
            self.report.drafted += len(drafted)
            self.report.layer_drafted += len(drafted) if layered else 0
            self.report.passes += 1
        return drafted

    def kept(self, position: int) -> None:
        """The token sampled at output ``position`` was the one drafted there."""
        assert self._open is not None
        drafted, kept, layered = self._open
        self._open = (drafted, kept + 1, layered)
        self.report.accepted += 1
        self.report.layer_accepted += int(layered)
        self.report.accepted_at.append(position)

    def close(self) -> None:
        """The current draft is over (kept whole or missed): adapt the draft length to it."""
        if self._open is None:
            return
        drafted, kept, _ = self._open
        self.length = min(self.spec.max_draft, self.length + 2) if kept == drafted else max(1, self.length - 1)
        self._open = None
