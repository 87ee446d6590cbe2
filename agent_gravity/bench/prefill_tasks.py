"""Seeded long-context tasks for ``bench prefill``: exact values buried in documents and logs at several depths,
and two-hop questions over two buried values, at lengths from 2K tokens to the model's context.

Each task is one user message (a document, then a question) and the answer's opening words, prefilled so that the
next tokens must be the value; recall is whether the greedy continuation holds it exactly.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent_gravity.bench.kv_tasks import SERVICES, log_line

_HOSTS = ("atlas", "borealis", "cobalt", "delta", "ember", "fjord", "granite", "harbor", "indigo", "juniper")
_TOPICS = ("the quarterly plan", "the migration", "the audit", "the incident review", "the hiring round",
           "the budget", "the roadmap", "the release train")
_VERBS = ("was discussed", "moved forward", "was postponed", "needs another review", "is on track",
          "was approved", "raised questions", "was summarised")
DEPTHS = (0.1, 0.5, 0.9)
KINDS = ("logs", "prose", "two_hop")


@dataclass(frozen=True)
class PrefillTask:
    """One long prompt with one exact answer."""

    id: str
    kind: str
    """``logs`` or ``prose`` (one buried value), or ``two_hop`` (a value found through another)."""
    tokens: int
    """The length it was built for (the prompt comes within a line of it)."""
    depth: float
    """Where the (second) value sits, as a share of the document."""
    messages: list[dict[str, str]]
    prefix: str
    value: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _code(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase + string.digits, k=6))


def _prose_line(rng: random.Random) -> str:
    return (f"In the {rng.choice(('morning', 'afternoon', 'weekly', 'monthly'))} meeting, {rng.choice(_TOPICS)} "
            f"{rng.choice(_VERBS)}, and {rng.choice(_TOPICS)} {rng.choice(_VERBS)}.")


def _filled(rng: random.Random, line: Callable[[random.Random], str], facts: list[tuple[float, str]],
            budget: int, count: Callable[[str], int]) -> str:
    """Filler lines up to ``budget`` tokens, with each fact inserted at its depth."""
    lines: list[str] = []
    size = 0
    while size < budget:
        lines.append(line(rng))
        size += count(lines[-1] + "\n")
    for depth, fact in sorted(facts, reverse=True):
        lines.insert(round(depth * len(lines)), fact)
    return "\n".join(lines)


def generate_prefill_tasks(lengths: Sequence[int], count: Callable[[str], int], per_cell: int = 1,
                           seed: int = 23, depths: Sequence[float] = DEPTHS,
                           kinds: Sequence[str] = KINDS) -> list[PrefillTask]:
    """``per_cell`` tasks for each length, depth and kind; ``count`` gives a text's tokens under the model's
    tokenizer, so prompts reach each length (within a line, plus the question)."""
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise ValueError(f"unknown prefill task kinds {unknown}; choose from {list(KINDS)}")
    if any(n < 256 for n in lengths) or per_cell < 1:
        raise ValueError(f"lengths must be at least 256 tokens and per_cell at least 1, got {list(lengths)}, {per_cell}")
    rng = random.Random(seed)
    out = []
    for n in lengths:
        for depth in depths:
            for kind in kinds:
                for i in range(per_cell):
                    out.append(_task(rng, kind, n, depth, count, f"{kind}-{n}-{depth:g}-{i}"))
    return out


def _task(rng: random.Random, kind: str, n: int, depth: float, count: Callable[[str], int],
          task_id: str) -> PrefillTask:
    service, value = rng.choice(SERVICES), _code(rng)
    budget = n - 96  # room for the question, the answer prefix and the chat template
    if kind == "two_hop":
        host = rng.choice(_HOSTS)
        first = min(depth, 1 - depth) / 2  # the host's line comes well before or after the code's
        facts = [(first, f"[NOTE] the {service} service runs on host {host}"),
                 (depth, f"[WARN] the access code for host {host} is {value}")]
        document = _filled(rng, log_line, facts, budget, count)
        question = f"What is the access code for the host that the {service} service runs on?"
        prefix = "The access code is"  # naming the host would answer the first hop
    else:
        line = log_line if kind == "logs" else _prose_line
        fact = (f"[WARN] the access code for {service} is {value}" if kind == "logs"
                else f"The access code for {service}, noted in passing, is {value}.")
        document = _filled(rng, line, [(depth, fact)], budget, count)
        question = f"What is the access code for {service}?"
        prefix = f"The access code for {service} is"
    messages = [{"role": "user", "content": f"{document}\n\n{question} Answer with the code only."}]
    return PrefillTask(task_id, kind, n, depth, messages, prefix, value)
