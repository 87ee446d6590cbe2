"""Scores a session's cache entries by context reconstruction (KVzip's idea), on the cache itself.

After the cache, the model reads an instruction to repeat its context and then that context,
chunk by chunk, teacher forced. An entry scores the most attention any of those queries in its KV
head's query group gives it: what the model reads to rebuild its context is what a later question,
unknown at trim time, can ask about. The fed tokens are cropped off after each chunk, so the cache
ends as it began; only a chunk's worth of extra entries ever exists.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from agent_gravity.backends._ragged_cache import RaggedCache

_SCORES: contextvars.ContextVar[EntryScores | None] = contextvars.ContextVar("agent_gravity_reconstruction",
                                                                             default=None)


@dataclass
class EntryScores:
    """Per layer and KV head, the largest attention each entry held at the start received (on the CPU)."""

    held: list[list[int]]
    """Entries per layer and KV head when scoring began; later entries (the fed tokens) are not scored."""
    best: list[list[torch.Tensor]]
    scales: dict[int, float] = field(default_factory=dict)
    """Per layer, the attention scale its module used (read from the reconstruction's calls)."""

    @classmethod
    def empty(cls, cache: RaggedCache) -> EntryScores:
        held = cache.lengths()
        return cls(held, [[torch.zeros(n) for n in layer] for layer in held])

    def observe(self, layer: int, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                scale: float) -> None:
        """Fold one attention call in: ``query`` ``[1, q_heads, q, d]``, ``key`` ``[1, kv_heads, width + q, d]``
        (each head's held entries first, padding hidden by ``mask``; None: level heads, causal new part). One KV
        head at a time, so memory stays ``[group, q, width + q]``."""
        self.scales[layer] = scale
        kv_heads, q = key.shape[1], query.shape[2]
        groups, width = query.shape[1] // kv_heads, key.shape[2] - q
        causal = torch.full((q, q), float("-inf"), device=query.device).triu(1)
        for h, n in enumerate(self.held[layer]):
            logits = query[0, h * groups:(h + 1) * groups].float() @ key[0, h].float().T * scale  # [g, q, keys]
            if mask is not None:
                logits += mask[0, h]
            else:
                logits[..., width:] += causal
            # the largest softmax weight is exp(max(logit - logsumexp)): no normalised matrix is written
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            weights = logits[..., :n].sub_(lse).amax(dim=(0, 1)).exp_().cpu()
            self.best[layer][h] = torch.maximum(self.best[layer][h], weights)

    def observe_recent(self, queries: Sequence[torch.Tensor | None], cache: RaggedCache) -> None:
        """Fold in the attention the recent queries (``[q_heads, w, d]`` per layer: the last ``w`` tokens read or
        written, a turn's own output when the model answered last) gave every held entry, each query over the
        keys before it."""
        for layer, (recent, heads) in enumerate(zip(queries, cache.heads)):
            if recent is None:
                continue
            groups, w = recent.shape[0] // len(heads), recent.shape[1]
            at = torch.arange(cache.next_position - w, cache.next_position, device=recent.device)
            scale = self.scales.get(layer, recent.shape[-1] ** -0.5)
            for h, head in enumerate(heads):
                n = self.held[layer][h]
                keys = head.layout()[0][:n].float()
                positions = torch.cat([head.packed_positions(), head.positions])[:n]
                logits = recent[h * groups:(h + 1) * groups].float() @ keys.T * scale
                logits.masked_fill_(positions[None, None, :] > at[None, :, None], float("-inf"))
                weights = torch.softmax(logits, dim=-1).nan_to_num_(0.0).amax(dim=(0, 1))
                self.best[layer][h] = torch.maximum(self.best[layer][h], weights.cpu())


def observing() -> EntryScores | None:
    """The scores the attention function should fold its call into, or None outside a reconstruction."""
    return _SCORES.get()


@contextmanager
def _collecting(scores: EntryScores) -> Iterator[EntryScores]:
    token = _SCORES.set(scores)
    try:
        yield scores
    finally:
        _SCORES.reset(token)


def reconstruction_scores(cache: RaggedCache, context: Sequence[int], instruction: Sequence[int], chunk: int,
                          feed: Callable[[Sequence[int], RaggedCache], object], recent: bool = False) -> EntryScores:
    """Score every entry ``cache`` holds by the attention it receives while the model, after ``instruction``,
    re-reads ``context`` in chunks of ``chunk`` tokens through ``feed`` (a forward pass); with ``recent``, the
    cache's remembered recent queries score too. The cache, its recent queries and its entropies are as they
    were afterwards."""
    start, queries = cache.next_position, list(cache.queries)
    scores = EntryScores.empty(cache)
    try:
        with _collecting(scores):
            for i in range(0, len(context), chunk):
                feed([*instruction, *context[i:i + chunk]], cache)
                cache.crop(start - cache.next_position)
    finally:
        cache.crop(start - cache.next_position)
        cache.queries = queries
    if recent:
        scores.observe_recent(queries, cache)
    return scores
