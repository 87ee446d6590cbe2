"""Top-2 sampling after the lock: inside a gravity zone, when the top token leads the second by at least
``margin`` in probability, the token is sampled from those two alone (renormalised); elsewhere, and at
temperature 0, sampling is untouched."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Top2Spec:
    margin: float = 0.5


@dataclass
class Top2Report:
    """Steps sampled from the top two, and at which output positions."""

    steps: int = 0
    at: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_top2(row: torch.Tensor, temperature: float, margin: float, generator: torch.Generator) -> int | None:
    """The token sampled among the top two of ``row`` (logits) at ``temperature``, or None when the top one's
    lead is under ``margin``."""
    probs = torch.softmax(row.float() / temperature, dim=-1)
    top, ids = torch.topk(probs, 2)
    if float(top[0] - top[1]) < margin:
        return None
    return int(ids[torch.multinomial(top / top.sum(), 1, generator=generator)])
