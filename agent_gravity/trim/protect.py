"""Exact-value protection: numbers, identifiers and code names must never be evicted while they may be asked for.

A log repeats its templates (``queue depth 12, latency 40ms`` on every line); the values in such
repeated lines are noise. Exact values are protected where they are rare: in lines whose template
(digits replaced) appears fewer than ``repeats`` times.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence

import torch

_EXACT = re.compile(r"\b\w*\d[\w.-]*\b|\b[A-Za-z]+_\w+\b|\b[A-Z][A-Z0-9]{2,}\b")
"""Words holding a digit (ids, codes, numbers), snake_case names, and all-caps codes."""
_DIGITS = re.compile(r"\d+")


def _value_spans(text: str, repeats: int) -> list[tuple[int, int]]:
    lines = text.split("\n")
    templates = Counter(_DIGITS.sub("#", line) for line in lines)
    spans, at = [], 0
    for line in lines:
        if templates[_DIGITS.sub("#", line)] < repeats:
            spans += [(at + a, at + b) for a, b in (m.span() for m in _EXACT.finditer(line))]
        at += len(line) + 1
    return spans


def exact_value_positions(ids: Sequence[int], token_texts: Sequence[str], repeats: int = 3) -> torch.Tensor:
    """Positions of the tokens that spell exact values, found in the text (a value often spans tokens);
    values in lines whose template repeats ``repeats`` times or more are log noise, not protected."""
    texts = [token_texts[t] for t in ids]
    ends = list(itertools.accumulate(len(t) for t in texts))
    starts = [e - len(t) for e, t in zip(ends, texts)]
    spans = _value_spans("".join(texts), repeats)
    keep = [i for i, (s, e) in enumerate(zip(starts, ends)) if e > s and any(s < b and a < e for a, b in spans)]
    return torch.tensor(keep, dtype=torch.long)
