"""Long structured outputs, where gravity zones are long: records to JSON, tables to CSV, code from a template,
and lines picked from a log. Seeded; each item lists the values a correct output must contain."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agent_gravity.bench.tasks import NAMES

CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Turin", "Sofia", "Accra", "Riga")
ITEMS = ("lamp", "chair", "table", "shelf", "clock", "mirror", "rug", "vase", "desk", "stool")
WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "zeta", "lambda")
LEVELS = ("INFO", "WARN", "ERROR")


@dataclass(frozen=True)
class StructuredTask:
    """One long structured output; it is correct when it contains every value in ``facts``."""

    id: str
    kind: str
    question: str
    facts: tuple[str, ...]

    def correct(self, text: str) -> bool:
        return all(f in text for f in self.facts)


def _records(r: random.Random) -> tuple[str, tuple[str, ...]]:
    people = [(r.choice(NAMES), r.randint(18, 90), r.choice(CITIES)) for _ in range(r.randint(4, 6))]
    lines = "\n".join(f"- {n}, aged {a}, lives in {c}" for n, a, c in people)
    return (f"Write these people as a JSON list of objects with the keys name, age and city:\n{lines}",
            tuple(v for n, a, c in people for v in (n, str(a), c)))


def _table(r: random.Random) -> tuple[str, tuple[str, ...]]:
    rows = [(r.choice(ITEMS), r.randint(1, 40), f"{r.randint(2, 99)}.{r.randint(0, 99):02d}") for _ in range(5)]
    table = "\n".join(f"| {i} | {q} | {p} |" for i, q, p in rows)
    return (f"Rewrite this table as CSV with the header item,quantity,price:\n| item | quantity | price |\n"
            f"|---|---|---|\n{table}", tuple(v for row in rows for v in map(str, row)))


def _code(r: random.Random) -> tuple[str, tuple[str, ...]]:
    names = r.sample(WORDS, 5)
    values = [r.randint(1, 999) for _ in names]
    pairs = ", ".join(f"{n} = {v}" for n, v in zip(names, values))
    return (f"Following this pattern:\n\ndef get_{names[0]}():\n    return {values[0]}\n\nwrite one Python function "
            f"for each of these settings: {pairs}.", tuple(f"def get_{n}():" for n in names) + tuple(map(str, values)))


def _log(r: random.Random) -> tuple[str, tuple[str, ...]]:
    lines = [(f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}", r.choice(LEVELS), f"job-{r.randint(100, 999)}")
             for _ in range(10)]
    if not any(level == "ERROR" for _, level, _ in lines):
        lines[r.randrange(len(lines))] = (lines[0][0], "ERROR", lines[0][2])
    log = "\n".join(f"{t} {level} {job} exited with code {i}" for i, (t, level, job) in enumerate(lines))
    errors = tuple(job for _, level, job in lines if level == "ERROR")
    return f"Copy every ERROR line of this log, unchanged, one per line:\n{log}", errors


KINDS = {"json_records": _records, "csv_table": _table, "code_template": _code, "log_lines": _log}


def generate_structured_tasks(per_kind: int, seed: int = 0) -> list[StructuredTask]:
    """``per_kind`` items of every kind, interleaved by kind; the same seed gives the same items."""
    r = random.Random(seed)
    made = {k: [make(r) for _ in range(per_kind)] for k, make in KINDS.items()}
    return [StructuredTask(f"{kind}-{i}", kind, *made[kind][i]) for i in range(per_kind) for kind in KINDS]
