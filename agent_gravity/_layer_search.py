"""``agent-gravity calibrate --layers``: which decoder layers this model can do without inside gravity zones.

Calibration prompts are answered once by the full model. Along those answers (teacher forcing, one forward pass
per answer and candidate), the model without a set of layers predicts the next token; only positions inside a
gravity zone count (the zone test the decode loop makes, on the full model's own entropies), since nothing else
ever runs without layers. A greedy search (as in Draft & Verify's and SWIFT's layer selection, scored here where
zones hold) grows the skipped set one layer at a time, each time adding the layer whose removal keeps the most
top-1 agreement with the full model. From that path:

- the **draft** layers are the set whose modelled self-speculation speedup is highest: a draft of ``k`` tokens
  costs ``k`` passes through the kept layers and is kept up to its first miss, at the measured per-token agreement
  (None when no set beats decoding without layer drafts);
- the **skip** layers (lossy, unchecked) are the largest set whose agreement stays at or above a target.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agent_gravity._profile import LayerCalibration, LayerStep
from agent_gravity.backends._compute import ComputeSpec
from agent_gravity.backends.base import GenerationRequest, SamplingSettings, drain


FLOOR = 0.7
"""The search stops below this agreement: drafts would have to skip over 30% of the layers to pay there (see
``modelled_speedup``), and unchecked skipping would change most answers."""


@dataclass(frozen=True)
class Sample:
    """One calibration answer: prompt and output ids, the output positions inside a zone, and the full model's
    teacher-forced top-1 token at each output position (the reference every layer set is scored against)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    zone: tuple[int, ...]
    top1: tuple[int, ...]


def answer_samples(backend: Any, questions: Sequence[str], max_tokens: int, compute: ComputeSpec) -> list[Sample]:
    """The full model's greedy answers to ``questions`` (a TransformersBackend), with their zone positions and
    top-1 tokens, teacher-forced (the entropies the decode loop would have seen, up to the rounding of one pass)."""
    out = []
    for question in questions:
        prompt = backend.render([{"role": "user", "content": question}])
        output = tuple(drain(backend.stream(GenerationRequest(prompt, SamplingSettings(max_tokens)))).token_ids)
        if len(output) > 1:
            top1, entropy = backend.forced(prompt, output)
            out.append(Sample(tuple(prompt), output, zone_positions(entropy, compute), tuple(top1)))
    return out


def zone_positions(entropy: Sequence[float], compute: ComputeSpec) -> tuple[int, ...]:
    """The output positions whose token the decode loop would compute inside a zone: the zone test holds on the
    entropies of the tokens before it."""
    zone, values = compute.zone, torch.tensor(list(entropy), dtype=torch.float32)
    return tuple(j for j in range(1, len(values)) if zone.holds(values[:j]))


def modelled_speedup(agreement: float, skipped: int, layers: int, max_draft: int) -> tuple[float, int]:
    """The best modelled speedup of drafting with ``skipped`` of ``layers`` layers removed at per-token agreement
    ``agreement``, and the draft length reaching it: a draft of k tokens keeps on average (1 - a^(k+1)) / (1 - a)
    tokens per full-depth pass (the pass's own token included) at a cost of 1 + k * (layers - skipped) / layers."""
    cost = (layers - skipped) / layers
    best = (1.0, 0)
    for k in range(1, max_draft + 1):
        kept = k + 1 if agreement >= 1 else (1 - agreement ** (k + 1)) / (1 - agreement)
        if kept / (1 + k * cost) > best[0]:
            best = (kept / (1 + k * cost), k)
    return best


class LayerSearch:
    """Scores layer sets on calibration answers through ``top1(prompt, output, skip)``: the model's top-1 token at
    each output position, teacher-forced, without the decoder layers ``skip``."""

    def __init__(self, samples: Sequence[Sample], top1: Callable[[Sequence[int], Sequence[int], tuple[int, ...]],
                                                                   list[int]]) -> None:
        self.samples = [s for s in samples if s.zone]
        if not self.samples:
            raise ValueError("no calibration answer entered a gravity zone: lower ComputeConfig.below's threshold "
                             "or calibrate on longer answers (--layer-tokens)")
        self.top1 = top1
        self.positions = sum(len(s.zone) for s in self.samples)

    def agreement(self, skip: tuple[int, ...]) -> float:
        """The share of zone positions at which the model without ``skip`` picks the full model's top-1 token."""
        same = 0
        for s in self.samples:
            picked = self.top1(s.prompt, s.output, skip)
            same += sum(picked[j] == s.top1[j] for j in s.zone)
        return same / self.positions

    def greedy(self, layers: int, most: int, floor: float = 0.0) -> list[LayerStep]:
        """The greedy path: each step adds the layer whose removal keeps the most agreement, up to ``most`` layers
        or until the agreement falls under ``floor``."""
        path, chosen = [], ()
        while len(chosen) < most:
            scored = [(self.agreement(tuple(sorted((*chosen, i)))), i) for i in range(layers) if i not in chosen]
            best, layer = max(scored, key=lambda t: (t[0], -t[1]))
            chosen = tuple(sorted((*chosen, layer)))
            path.append(LayerStep(layers=chosen, agreement=best))
            if best < floor:
                break
        return path


def choose(path: Sequence[LayerStep], layers: int, max_draft: int, skip_target: float) -> dict:
    """The draft and skip layers a search path gives (see the module docstring)."""
    drafts = [(modelled_speedup(s.agreement, len(s.layers), layers, max_draft), s) for s in path]
    (speedup, length), draft = max(drafts, key=lambda t: t[0][0]) if drafts else ((1.0, 0), None)
    kept = [s for s in path if s.agreement >= skip_target]
    return {"draft_layers": draft.layers if draft is not None and speedup > 1 else None,
            "modelled_speedup": speedup if speedup > 1 else None, "draft_length": length if speedup > 1 else None,
            "skip_layers": kept[-1].layers if kept else None}


def calibrate_layers(search: LayerSearch, layers: int, compute: ComputeSpec, most: int, skip_target: float,
                     max_draft: int) -> LayerCalibration:
    """Search, choose, and record what the profile keeps."""
    path = search.greedy(layers, most, floor=min(skip_target, FLOOR))
    return LayerCalibration(**choose(path, layers, max_draft, skip_target), path=path, skip_target=skip_target,
                            below=compute.below, window=compute.window, answers=len(search.samples),
                            positions=search.positions, layers_total=layers,
                            when=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
