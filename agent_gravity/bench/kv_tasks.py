"""Seeded multi-turn agent transcripts for ``bench kv``: tool outputs full of log noise, exact values
(codes, ids, numbers) buried in them, and later questions about values from early, middle and late turns."""

from __future__ import annotations

import random
import string
from dataclasses import asdict, dataclass
from typing import Any

SERVICES = ("billing", "search", "auth", "storage", "mailer", "gateway", "ledger", "metrics", "scheduler", "cache")
_KINDS = (("access code", lambda r: "".join(r.choices(string.ascii_uppercase + string.digits, k=6))),
          ("ticket id", lambda r: f"T-{r.randint(10000, 99999)}"),
          ("port", lambda r: str(r.randint(1024, 9999))))


@dataclass(frozen=True)
class Question:
    """A later question: where its value was buried, the answer's first words, and the exact value."""

    turn: str
    """``early``, ``middle`` or ``late``: which tool output holds the value."""
    question: str
    prefix: str
    """The answer's opening words, prefilled so that the next tokens must be the value."""
    value: str


@dataclass(frozen=True)
class Transcript:
    """A conversation (chat dicts) and the questions later turns ask about it."""

    id: str
    messages: list[dict[str, str]]
    questions: list[Question]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def log_line(rng: random.Random) -> str:
    """One line of log noise: a heartbeat from a random service."""
    return (f"[{rng.choice(('INFO', 'DEBUG'))}] {rng.choice(SERVICES)}: heartbeat ok, queue depth "
            f"{rng.randint(0, 40)}, latency {rng.randint(1, 90)}ms")


def _noise(rng: random.Random, lines: int) -> list[str]:
    return [log_line(rng) for _ in range(lines)]


def _tool_output(rng: random.Random, fact: str, lines: int) -> str:
    out = _noise(rng, lines)
    out.insert(rng.randint(lines // 4, 3 * lines // 4), f"[WARN] {fact}")
    return "\n".join(out)


def generate_transcripts(n: int = 24, seed: int = 11, noise_lines: int = 30) -> list[Transcript]:
    """``n`` transcripts with three tool outputs each and one question per output."""
    if n < 1 or noise_lines < 4:
        raise ValueError(f"need at least 1 transcript and 4 noise lines, got {n} and {noise_lines}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": "You are an operations agent. Tool outputs are logs."},
                    {"role": "user", "content": "Check the three services and report back."}]
        questions = []
        for turn, service in zip(("early", "middle", "late"), rng.sample(SERVICES, 3)):
            kind, make = rng.choice(_KINDS)
            value = make(rng)
            messages += [{"role": "assistant", "content": f"Checking {service}."},
                         {"role": "user", "content": "Tool output:\n" + _tool_output(
                             rng, f"the {kind} for {service} is {value}", noise_lines)}]
            questions.append(Question(turn, f"What is the {kind} for {service}?",
                                      f"The {kind} for {service} is", value))
        messages.append({"role": "assistant", "content": "All three services checked."})
        out.append(Transcript(f"t{i}", messages, questions))
    return out
