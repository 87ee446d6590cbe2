"""Lossy layer skipping after the lock: inside a gravity zone, the next token is computed without some middle
decoder layers, and nothing checks it (the concept's group C; its answer preservation is measured by
``agent-gravity bench groups``). A skipped layer writes no KV entry for that position: the ragged cache lets
each layer hold its own entries, so later full-depth steps attend to what each layer has.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class SkipSpec:
    """The decoder layers a step inside a zone skips: ``layers``, or else the middle ``fraction`` of them."""

    fraction: float = 0.25
    layers: tuple[int, ...] | None = None


@dataclass
class SkipReport:
    """Steps taken with layers skipped, and the layer passes that saved."""

    layers: tuple[int, ...]
    steps: int = 0
    skipped_at: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layers": list(self.layers), "layer_passes_saved": self.steps * len(self.layers)}


def middle_layers(num_layers: int, fraction: float) -> tuple[int, ...]:
    """The centred block of ``round(fraction * num_layers)`` layers, never the first or last two (where
    layer-skipping studies find the network least redundant)."""
    count = min(round(fraction * num_layers), max(0, num_layers - 4))
    start = (num_layers - count) // 2
    return tuple(range(start, start + count))


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers causal LM (``model.model.layers``); ValueError when it has none."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} keeps no decoder layers at model.model.layers: it cannot skip "
                         "layers; use ComputeConfig(skip=None)")
    return layers


@contextmanager
def skipping(model: torch.nn.Module, layers: tuple[int, ...]) -> Iterator[None]:
    """Run ``model`` without ``layers`` inside the block (each kept layer keeps its own index for the cache)."""
    if not layers:
        yield
        return
    inner, full, skipped = model.model, decoder_layers(model), set(layers)
    inner.layers = torch.nn.ModuleList(layer for i, layer in enumerate(full) if i not in skipped)
    try:
        yield
    finally:
        inner.layers = full
