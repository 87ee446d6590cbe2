"""Seeded multi-turn agent transcripts for ``bench kv``: tool outputs full of noise, exact values (codes, ids,
numbers) buried in them, and later questions about values from early, middle and late turns.

Five families word them differently (``FAMILIES``): an operations agent reading logs, a support agent reading
JSON records, an inventory audit over CSV tables, an assistant reading email threads, and a deployment agent
comparing configuration files. Each has its own subjects, kinds of value, noise, and question wording."""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

SERVICES = ("billing", "search", "auth", "storage", "mailer", "gateway", "ledger", "metrics", "scheduler", "cache")
TURNS = ("early", "middle", "late")
_Make = Callable[[random.Random], str]


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
    family: str
    """The ``FAMILIES`` entry that worded it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Family:
    """How one family words a transcript: the agent's role and task, its turn before each tool output, the
    subjects and kinds of value, a unit of noise, the unit holding the value, the tool output around the units,
    and the later question with the answer's opening words."""

    system: str
    task: str
    call: str
    """The assistant's turn before a tool output, formatted with ``subject``."""
    subjects: tuple[str, ...]
    kinds: tuple[tuple[str, _Make], ...]
    noise: _Make
    fact: Callable[[str, str, str], str]
    """(kind, subject, value) -> the unit that holds the value."""
    output: Callable[[str, list[str]], str]
    """(subject, units) -> the tool output's text."""
    ask: Callable[[str, str], tuple[str, str]]
    """(kind, subject) -> the question and the answer's opening words."""
    done: str
    """The assistant's turn after the last tool output."""


def _chars(alphabet: str, k: int, head: str = "") -> _Make:
    return lambda r: head + "".join(r.choices(alphabet, k=k))


def _number(lo: int, hi: int, head: str = "") -> _Make:
    return lambda r: f"{head}{r.randint(lo, hi)}"


def log_line(rng: random.Random) -> str:
    """One line of log noise: a heartbeat from a random service."""
    return (f"[{rng.choice(('INFO', 'DEBUG'))}] {rng.choice(SERVICES)}: heartbeat ok, queue depth "
            f"{rng.randint(0, 40)}, latency {rng.randint(1, 90)}ms")


_CUSTOMERS = ("Acme Corp", "Birch Labs", "Cedar Health", "Dune Freight", "Elm Studios", "Fern Bank", "Gale Motors",
              "Hawk Retail", "Iris Media", "Jade Foods")
_PEOPLE = ("Priya", "Tomasz", "Aiko", "Mateo", "Fatima", "Lars", "Chen", "Olu", "Sofia", "Dmitri")
_GROUPS = ("web", "db", "queue", "batch", "edge", "backup", "vpn", "dns", "ml", "proxy")
_APPS = ("payments", "catalog", "profile", "checkout", "notifier", "reports", "uploads", "inventory", "pricing",
         "sessions")
_UPPER = string.ascii_uppercase + string.digits


def _record(rng: random.Random) -> str:
    return (f'{{"customer": "{rng.choice(_CUSTOMERS)}", "plan": "{rng.choice(("free", "pro", "team"))}", '
            f'"seats": {rng.randint(1, 80)}, "status": "{rng.choice(("active", "trial", "paused"))}"}}')


def _host_row(rng: random.Random) -> str:
    return (f"node-{rng.randint(10, 99)},{rng.choice(('ok', 'ok', 'degraded', 'draining'))},"
            f"{rng.randint(3, 97)}%,-")


def _sentence(rng: random.Random) -> str:
    return (f"{rng.choice(_PEOPLE)} {rng.choice(('thinks', 'agreed', 'asked whether', 'confirmed'))} the "
            f"{rng.choice(('offsite', 'launch', 'vendor review', 'team lunch', 'contract renewal'))} "
            f"{rng.choice(('can move to Thursday', 'needs a new owner', 'is still on', 'went well'))}.")


def _setting(rng: random.Random) -> str:
    key, value = rng.choice((("max_connections", lambda: rng.choice((128, 256, 512))),
                             ("log_level", lambda: rng.choice(("info", "debug", "warn"))),
                             ("retry_backoff", lambda: f"{rng.randint(1, 9) * 50}ms"),
                             ("feature_flags", lambda: rng.choice(("[]", "[beta]", "[dark_mode]"))),
                             ("workers", lambda: rng.randint(2, 32))))
    return f"{key}: {value()}"


FAMILIES: dict[str, Family] = {
    "logs": Family(
        "You are an operations agent. Tool outputs are logs.", "Check the three services and report back.",
        "Checking {subject}.", SERVICES,
        (("access code", _chars(_UPPER, 6)), ("ticket id", _number(10000, 99999, "T-")), ("port", _number(1024, 9999))),
        log_line, lambda kind, subject, value: f"[WARN] the {kind} for {subject} is {value}",
        lambda subject, units: "Tool output:\n" + "\n".join(units),
        lambda kind, subject: (f"What is the {kind} for {subject}?", f"The {kind} for {subject} is"),
        "All three services checked."),
    "json": Family(
        "You are a support agent. Tools return customer records as JSON.",
        "Look up the three customers on this ticket and summarise their accounts.",
        "Fetching the records of {subject}.", _CUSTOMERS,
        (("invoice number", _number(10000, 99999, "INV-")), ("account id", _number(1000000, 9999999, "AC")),
         ("postcode", _number(10000, 99999))),
        _record,
        lambda kind, subject, value: f'{{"customer": "{subject}", "{kind.replace(" ", "_")}": "{value}"}}',
        lambda subject, units: "Result:\n[\n  " + ",\n  ".join(units) + "\n]",
        lambda kind, subject: (f"Which {kind} does {subject} have on file?",
                               f"The {kind} on file for {subject} is"), "All three accounts fetched."),
    "table": Family(
        "You are an infrastructure assistant. Tools print inventory tables as CSV.",
        "Audit the three host groups and list anything unusual.", "Listing the {subject} hosts.", _GROUPS,
        (("serial", _chars(_UPPER, 8, "SN")), ("rack", _number(100, 999, "R-")),
         ("asset tag", _chars(string.digits, 6, "AT"))),
        _host_row, lambda kind, subject, value: f"{subject}-primary,ok,41%,{kind} {value}",
        lambda subject, units: f"inventory {subject}\nhost,status,load,note\n" + "\n".join(units),
        lambda kind, subject: (f"In the {subject} inventory, what {kind} is noted for {subject}-primary?",
                               f"The {kind} noted for {subject}-primary is"), "All three groups listed."),
    "email": Family(
        "You are an executive assistant. Tools return email threads.",
        "Read the three threads in my inbox and tell me what needs doing.", "Opening the thread from {subject}.",
        _PEOPLE,
        (("booking reference", _chars(_UPPER, 6)), ("meeting room", _number(100, 499, "B-")),
         ("budget code", _number(1000, 9999, "BC"))),
        _sentence, lambda kind, subject, value: f"{subject} wrote that the {kind} is {value}, please keep it handy.",
        lambda subject, units: f"From: {subject}\n\n" + " ".join(units),
        lambda kind, subject: (f"What {kind} did {subject} mention?", f"The {kind} {subject} mentioned is"),
        "All three threads read."),
    "config": Family(
        "You are a deployment agent. Tools print configuration files.",
        "Compare the configuration of three services before the rollout.", "Reading the config of {subject}.",
        _APPS,
        (("timeout_ms", _number(1000, 60000)), ("replica_set", _chars(string.ascii_lowercase, 4, "rs-")),
         ("cert_serial", _chars("0123456789abcdef", 10))),
        _setting, lambda kind, subject, value: f"{kind}: {value}",
        lambda subject, units: f"# {subject}.yaml\n" + "\n".join(units),
        lambda kind, subject: (f"What {kind} is set in the {subject} config?",
                               f"In the {subject} config, {kind} is set to"), "All three configs read."),
}


def generate_transcripts(n: int = 24, seed: int = 11, noise_lines: int = 30,
                         families: Sequence[str] = ("logs",)) -> list[Transcript]:
    """``n`` transcripts per family (interleaved) with three tool outputs each and one question per output;
    ``noise_lines`` units of noise (log lines, records, rows, sentences, settings) around each value."""
    if n < 1 or noise_lines < 4:
        raise ValueError(f"need at least 1 transcript and 4 noise lines, got {n} and {noise_lines}")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown or not families:
        raise ValueError(f"unknown transcript families {unknown or '(none given)'}; known: {sorted(FAMILIES)}")
    rng = random.Random(seed)
    out = []
    for i in range(n * len(families)):
        name = families[i % len(families)]
        family = FAMILIES[name]
        messages = [{"role": "system", "content": family.system}, {"role": "user", "content": family.task}]
        questions = []
        for turn, subject in zip(TURNS, rng.sample(family.subjects, 3)):
            kind, make = rng.choice(family.kinds)
            value = make(rng)
            units = [family.noise(rng) for _ in range(noise_lines)]
            units.insert(rng.randint(noise_lines // 4, 3 * noise_lines // 4), family.fact(kind, subject, value))
            messages += [{"role": "assistant", "content": family.call.format(subject=subject)},
                         {"role": "user", "content": family.output(subject, units)}]
            questions.append(Question(turn, *family.ask(kind, subject), value))
        messages.append({"role": "assistant", "content": family.done})
        out.append(Transcript(f"{name}-t{i // len(families)}", messages, questions, name))
    return out
