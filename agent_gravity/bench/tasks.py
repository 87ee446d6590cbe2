"""Seeded task set of the token-savings benchmark, and the scoring of a model's answers to it.

The items are short and simple on purpose: the benchmarked model (SmolLM2-135M-Instruct) is tiny, and the
savings are only meaningful on items it solves some of the time. ``python -m agent_gravity.bench.tasks``
regenerates the shipped JSONL file from ``generate_tasks()``.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path

DEFAULT_PATH = Path(__file__).parent / "data" / "savings_tasks.jsonl"
SCORINGS = ("number", "word", "free_text")
FREE_TEXT_AGREEMENT = 0.5

NAMES = ("Tom", "Ann", "Sam", "Mia", "Ben", "Lily", "Max", "Zoe", "Leo", "Eva", "Nina", "Omar")
# Names only the task families (families.py) ask about: word answers this set never has.
PEOPLE = ("Ravi", "Dana", "Kofi", "Ines", "Yuki", "Pablo", "Hana", "Theo", "Amir", "Lena")
OBJECTS = ("apples", "pens", "books", "cards", "stickers", "coins", "marbles", "cookies", "shells", "stamps")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "brown", "black", "white")
FRUITS = ("apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "pear", "plum", "kiwi")
ANIMALS = ("cat", "dog", "horse", "rabbit", "tiger", "zebra", "lion", "goat", "duck", "owl")
ORDINALS = ("first", "second", "third", "fourth")
# (larger unit, smaller unit, how many smaller units make one larger): every conversion is an integer.
UNITS = (("hours", "minutes", 60), ("minutes", "seconds", 60), ("days", "hours", 24), ("weeks", "days", 7),
         ("meters", "centimeters", 100), ("kilograms", "grams", 1000))
LETTER_WORDS = ("banana", "apple", "letter", "balloon", "coffee", "pepper", "cherry", "strawberry", "committee",
                "bookkeeper", "success", "tomato", "parallel", "mississippi", "raspberry", "assessment")
PHENOMENA = ("the sky is blue", "ice floats on water", "leaves change color in autumn", "we have seasons",
             "bread rises in the oven", "metal feels colder than wood", "the moon has phases", "plants need sunlight",
             "people need sleep", "salt melts ice on roads", "we see lightning before we hear thunder",
             "a spoon looks bent in a glass of water")
TOOLS = ("a hammer", "an umbrella", "a refrigerator", "a compass", "a thermometer", "a ladder", "a calendar",
         "a map", "a microscope", "a kettle", "a bicycle helmet", "a library card")
STORY_STARTS = ("{n} started a small garden behind the house.", "{n} joined the town's running club.",
                "{n} adopted a shy dog from the shelter.", "{n} opened a little bakery on the main street.",
                "{n} began learning to play the piano.", "{n} moved to a new city for work.")
STORY_MIDDLES = ("At first it was hard and progress was slow.", "Every day {n} practiced a little more.",
                 "Friends came to help on the weekends.", "There were many mistakes along the way.")
STORY_ENDS = ("After a year, it had become the best part of the week.", "By summer, the effort had clearly paid off.",
              "Now {n} helps others do the same.", "")
# Words a word-scored answer can be: every word answer the generator makes is drawn from these pools.
ANSWER_WORDS = frozenset(w.lower() for pool in (NAMES, PEOPLE, DAYS, MONTHS, COLORS, FRUITS, ANIMALS) for w in pool)
CALENDAR_WORDS = frozenset(w.lower() for w in DAYS + MONTHS)
# Kinds whose word answers are a day or month reached from the one the question names, never named in it.
DATE_KINDS = frozenset({"date", "dates"})
# Lowercase these are ordinary words ("it may be", "they march"), not months.
CAPITALIZED_ONLY = frozenset({"may", "march"})


@dataclass(frozen=True)
class Task:
    """One benchmark item; ``answer`` is None for free-text items, which have no ground truth.

    ``pair`` is the id an item shares with its paraphrase twin (the same question worded differently), or None.
    """

    id: str
    kind: str
    question: str
    answer: str | None
    scoring: str
    pair: str | None = None


Template = Callable[[random.Random], tuple[str, object]]


def _add(r: random.Random) -> tuple[str, object]:
    n, o, a, b = r.choice(NAMES), r.choice(OBJECTS), r.randint(2, 20), r.randint(2, 20)
    return f"{n} has {a} {o} and buys {b} more. How many {o} does {n} have now?", a + b


def _subtract(r: random.Random) -> tuple[str, object]:
    n, o, a = r.choice(NAMES), r.choice(OBJECTS), r.randint(5, 20)
    b = r.randint(1, a - 1)
    return f"{n} has {a} {o} and gives {b} away. How many {o} are left?", a - b


def _multiply(r: random.Random) -> tuple[str, object]:
    n, o, a, b = r.choice(NAMES), r.choice(OBJECTS), r.randint(2, 5), r.randint(2, 6)
    return f"{n} buys {a} bags with {b} {o} in each. How many {o} is that in total?", a * b


def _two_step(r: random.Random) -> tuple[str, object]:
    n, o, a, b = r.choice(NAMES), r.choice(OBJECTS), r.randint(3, 12), r.randint(2, 9)
    c = r.randint(1, a + b - 1)
    return f"{n} has {a} {o}, buys {b} more, then gives {c} away. How many {o} does {n} have now?", a + b - c


def _larger_or_smaller(r: random.Random) -> tuple[str, object]:
    a, b = r.sample(range(10, 100), 2)
    word, pick = r.choice((("larger", max), ("smaller", min)))
    return f"Which is {word}, {a} or {b}?", pick(a, b)


def _people(r: random.Random) -> tuple[str, object]:
    (n1, n2), (word, unit, span) = r.sample(NAMES, 2), r.choice((("taller", "cm", range(140, 190)),
                                                                ("older", "years old", range(5, 80))))
    v1, v2 = r.sample(span, 2)
    return f"Who is {word}, {n1} ({v1} {unit}) or {n2} ({v2} {unit})?", n1 if v1 > v2 else n2


def _unit(r: random.Random) -> tuple[str, object]:
    (big, small, f), n = r.choice(UNITS), r.randint(2, 9)
    return r.choice(((f"How many {small} are in {n} {big}?", n * f), (f"Convert {n} {big} to {small}.", n * f),
                     (f"How many {big} are in {n * f} {small}?", n)))


def _letters(r: random.Random) -> tuple[str, object]:
    w = r.choice(LETTER_WORDS)
    c = r.choice(sorted(set(w)))
    return f"How many times does the letter {c} appear in '{w}'?", w.count(c)


def _words(r: random.Random) -> tuple[str, object]:
    adjectives = r.sample(("big", "small", "red", "old", "happy", "new"), r.randint(1, 2))
    place = r.choice(((), ("in", "the", r.choice(("park", "garden", "kitchen", "yard")))))
    words = [r.choice(NAMES), r.choice(("saw", "found", "painted", "washed", "liked")), "the", *adjectives,
             r.choice(("dog", "car", "house", "ball", "boat")), *place]
    return f"How many words are in the sentence '{' '.join(words)}'?", len(words)


def _items(r: random.Random) -> tuple[str, object]:
    items = r.sample(r.choice((COLORS, FRUITS, ANIMALS)), r.randint(3, 7))
    return f"How many items are in the list: {', '.join(items)}?", len(items)


def _day_shift(r: random.Random) -> tuple[str, object]:
    d, n, sign = r.randrange(7), r.randint(2, 6), r.choice((1, -1))
    when = f"is it in {n} days" if sign > 0 else f"was it {n} days ago"
    return f"If today is {DAYS[d]}, what day {when}?", DAYS[(d + sign * n) % 7]


def _month_shift(r: random.Random) -> tuple[str, object]:
    m, n, sign = r.randrange(12), r.randint(1, 5), r.choice((1, -1))
    shift = f"{n} month{'s' * (n > 1)} {'after' if sign > 0 else 'before'}"
    return f"What month comes {shift} {MONTHS[m]}?", MONTHS[(m + sign * n) % 12]


def _nth_item(r: random.Random) -> tuple[str, object]:
    items, i = r.sample(r.choice((COLORS, FRUITS, ANIMALS)), r.randint(4, 5)), r.randrange(4)
    return f"What is the {ORDINALS[i]} item in the list: {', '.join(items)}?", items[i]


def _extreme(r: random.Random) -> tuple[str, object]:
    nums, (word, pick) = r.sample(range(1, 100), r.randint(4, 5)), r.choice((("largest", max), ("smallest", min)))
    return f"What is the {word} number in {', '.join(map(str, nums))}?", pick(nums)


def _alphabetical(r: random.Random) -> tuple[str, object]:
    words = r.sample(FRUITS + ANIMALS, 4)
    while len({w[0] for w in words}) < 4:  # a shared initial would make the tiny model compare second letters
        words = r.sample(FRUITS + ANIMALS, 4)
    return f"Which word comes first in alphabetical order: {', '.join(words)}?", min(words)


def _free_text(r: random.Random) -> tuple[str, object]:
    n, story = r.choice(NAMES), (r.choice(STORY_STARTS), r.choice(STORY_MIDDLES), r.choice(STORY_ENDS))
    return r.choice((f"Explain in one sentence why {r.choice(PHENOMENA)}.",
                     f"Describe in one sentence what {r.choice(TOOLS)} is used for.",
                     "Summarize in one sentence: " + " ".join(p.format(n=n) for p in story if p))), None


REASONING: dict[str, tuple[Template, ...]] = {
    "arithmetic": (_add, _subtract, _multiply, _two_step),
    "comparison": (_larger_or_smaller, _people),
    "unit": (_unit,),
    "counting": (_letters, _words, _items),
    "date": (_day_shift, _month_shift),
    "list": (_nth_item, _extreme, _alphabetical),
}
FREE_TEXT: tuple[Template, ...] = (_free_text,)


def _draw(r: random.Random, templates: tuple[Template, ...], seen: set[str]) -> tuple[str, object]:
    for _ in range(1000):
        question, answer = r.choice(templates)(r)
        if question not in seen:
            seen.add(question)
            return question, answer
    raise RuntimeError("templates exhausted: too many tasks asked of one kind")


def scoring_of(answer: object) -> str:
    """The scoring a generated answer gets: ``free_text`` for None, ``number`` for an int, else ``word``."""
    return "free_text" if answer is None else "number" if isinstance(answer, int) else "word"


def generate_tasks(seed: int = 0, n_reasoning: int = 210, n_free_text: int = 30) -> list[Task]:
    """The task set for ``seed``: reasoning kinds in round-robin, then the free-text items."""
    r, seen, counts, tasks = random.Random(seed), set[str](), Counter[str](), []
    names = list(REASONING)
    kinds = [names[i % len(names)] for i in range(n_reasoning)] + ["free_text"] * n_free_text
    for kind in kinds:
        question, answer = _draw(r, REASONING.get(kind, FREE_TEXT), seen)
        tasks.append(Task(f"{kind}-{counts[kind]:04d}", kind, question, None if answer is None else str(answer),
                          scoring_of(answer)))
        counts[kind] += 1
    return tasks


def write_tasks(tasks: Iterable[Task], path: Path) -> Path:
    """Write ``tasks`` as JSONL, one object with sorted keys a line; ``pair`` only where an item has one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(_task_dict(t), sort_keys=True) + "\n" for t in tasks))
    return path


def _task_dict(task: Task) -> dict[str, str | None]:
    data = asdict(task)
    if task.pair is None:  # files of unpaired tasks stay as they were before pairs existed
        del data["pair"]
    return data


_REQUIRED_KEYS = {"id", "kind", "question", "answer", "scoring"}


def _parse_task(line: str) -> Task:
    data = json.loads(line)
    if not isinstance(data, dict) or set(data) - {"pair"} != _REQUIRED_KEYS:
        raise ValueError("expected an object with keys answer, id, kind, question, scoring, and optionally pair")
    task = Task(**data)
    texts = (task.id, task.kind, task.question, task.scoring)
    if not all(isinstance(v, str) for v in texts) or not isinstance(task.answer, str | None):
        raise ValueError("every field must be a string, or null for the answer of a free-text item")
    if "pair" in data and not isinstance(task.pair, str):
        raise ValueError("pair, where present, must be a string")
    if task.scoring not in SCORINGS or (task.answer is None) != (task.scoring == "free_text"):
        raise ValueError(f"scoring {task.scoring!r} does not fit answer {task.answer!r}")
    return task


def load_tasks(path: Path | None = None) -> list[Task]:
    """Read a JSONL task file, by default the shipped one; a malformed line raises ValueError naming it."""
    path = DEFAULT_PATH if path is None else Path(path)
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(_parse_task(line))
        except ValueError as error:  # json.JSONDecodeError is a ValueError too
            raise ValueError(f"{path}, line {number}: malformed task: {error}") from error
    return tasks


def normalize(text: str) -> str:
    """Lowercase ``text``, turn punctuation into spaces and collapse whitespace."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


# Thousands groups only when exactly three digits follow a comma, so "3, 4" reads as 3, not 34.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def _first_number(text: str) -> str:
    match = _NUMBER.search(text)
    if match is None:
        return ""
    value = Decimal(match.group().replace(",", ""))
    return str(int(value)) if value == value.to_integral_value() else format(value.normalize(), "f")


def _first_word(task: Task, text: str) -> str:
    # Date answers never appear in the question, so a restated "today is Monday" must not count; the
    # other word answers are always one of the options the question names.
    asked = set(normalize(task.question).split())
    candidates = CALENDAR_WORDS - asked if task.kind in DATE_KINDS else ANSWER_WORDS & asked
    for word in re.sub(r"[^\w\s]", " ", text).split():
        low = word.lower()
        if low in candidates and (word[0].isupper() or low not in CAPITALIZED_ONLY):
            return low
    return ""


def extract_answer(task: Task, text: str) -> str:
    """The comparable answer in a model's ``text``; "" when it holds none.

    number: the first number ("1,200" -> "1200", "3.0" -> "3", "-4"). word: the first word of the text
    that is a possible answer (an option the question names; for items of the ``DATE_KINDS``, a day or
    month it does not name; "may" and "march" only capitalized), lowercased. free_text: the whole text,
    normalized.
    """
    if task.scoring == "number":
        return _first_number(text)
    if task.scoring == "word":
        return _first_word(task, text)
    return normalize(text)


def is_correct(task: Task, text: str) -> bool:
    """Whether ``text`` gives the task's answer; always False for free-text items, which have none."""
    if task.answer is None:
        return False
    return extract_answer(task, text) == extract_answer(task, task.answer)


def token_f1(a: str, b: str) -> float:
    """Unigram F1 of the normalized tokens of ``a`` and ``b``; 1.0 when both are empty."""
    ta, tb = normalize(a).split(), normalize(b).split()
    if not ta or not tb:
        return float(ta == tb)
    return 2 * sum((Counter(ta) & Counter(tb)).values()) / (len(ta) + len(tb))


def agrees(task: Task, text_a: str, text_b: str) -> bool:
    """Whether two runs give the same answer: equal extractions, or F1 >= 0.5 for free-text items.

    Two runs that both give no extractable answer agree only when their normalized texts are equal.
    """
    if task.scoring == "free_text":
        return token_f1(text_a, text_b) >= FREE_TEXT_AGREEMENT
    a, b = extract_answer(task, text_a), extract_answer(task, text_b)
    return a == b if a or b else normalize(text_a) == normalize(text_b)


def main() -> None:
    """Regenerate the shipped task file from the default seed."""
    tasks = generate_tasks()
    print(f"wrote {len(tasks)} tasks to {write_tasks(tasks, DEFAULT_PATH)}")


if __name__ == "__main__":
    main()
