"""Exact-value protection: numbers, identifiers and code names must never be evicted while they may be asked for."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import torch

_EXACT = re.compile(r"\b\w*\d[\w.-]*\b|\b[A-Za-z]+_\w+\b|\b[A-Z][A-Z0-9]{2,}\b")
"""Words holding a digit (ids, codes, numbers), snake_case names, and all-caps codes."""


def exact_value_positions(ids: Sequence[int], token_texts: Sequence[str]) -> torch.Tensor:
    """Positions of the tokens that spell exact values, found in the text (a value often spans tokens)."""
    texts = [token_texts[t] for t in ids]
    ends = list(itertools.accumulate(len(t) for t in texts))
    starts = [e - len(t) for e, t in zip(ends, texts)]
    spans = [m.span() for m in _EXACT.finditer("".join(texts))]
    keep = [i for i, (s, e) in enumerate(zip(starts, ends)) if e > s and any(s < b and a < e for a, b in spans)]
    return torch.tensor(keep, dtype=torch.long)
