"""Task families for answer preservation under distribution shift, every item paired with a paraphrase twin.

Each family asks short questions like those of ``tasks.py`` in its own templates, wording and answer formats,
and each item comes with a twin: the same question (same numbers, names and answer) worded differently, with
the same ``pair`` id. The scoring of ``tasks.py`` scores them all. ``python -m agent_gravity.bench.families``
regenerates the shipped JSONL file from ``generate_families()``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from agent_gravity.bench.tasks import (
    ANIMALS,
    COLORS,
    DAYS,
    FRUITS,
    MONTHS,
    NAMES,
    PEOPLE,
    Task,
    load_tasks,
    scoring_of,
    write_tasks,
)

FAMILIES_PATH = Path(__file__).parent / "data" / "family_tasks.jsonl"

# A template draws one question and returns its wordings (at least two) and its answer; twins are two of them.
Twins = Callable[[random.Random], tuple[tuple[str, ...], object]]

# word_problems

MAKERS = (("baker", "baked", "bake", "loaves"), ("gardener", "picked", "pick", "tomatoes"),
          ("painter", "painted", "paint", "pictures"), ("tailor", "sewed", "sew", "shirts"),
          ("cook", "made", "make", "pies"), ("potter", "shaped", "shape", "bowls"))
LEAVERS = (("birds", "on a wire", "flew off"), ("ducks", "in a pond", "swam away"), ("people", "on a bus", "got off"),
           ("frogs", "on a log", "hopped away"), ("cars", "in a car park", "drove away"))
CONTAINERS = (("box", "boxes", "eggs"), ("pack", "packs", "crayons"), ("tray", "trays", "muffins"),
              ("shelf", "shelves", "jars"), ("vase", "vases", "tulips"))
SHARED = ("stickers", "grapes", "pencils", "beads", "crackers")


def _made(r: random.Random) -> tuple[tuple[str, ...], object]:
    (job, past, verb, things), a, b = r.choice(MAKERS), r.randint(5, 30), r.randint(5, 30)
    return ((f"A {job} {past} {a} {things} in the morning and {b} in the afternoon. How many {things} did the "
             f"{job} {verb}?"),
            (f"In the morning a {job} {past} {a} {things}, and in the afternoon {b} more. How many {things} is "
             f"that altogether?"),
            f"Before lunch a {job} {past} {a} {things}; after lunch, {b}. What is the total number of {things}?"
            ), a + b


def _left(r: random.Random) -> tuple[tuple[str, ...], object]:
    (things, place, went), a = r.choice(LEAVERS), r.randint(12, 40)
    b = r.randint(2, a - 2)
    return (f"There were {a} {things} {place}; {b} {went}. How many {things} remain?",
            f"At first {a} {things} were {place}. Then {b} of them {went}. How many are still {place}?",
            f"Of the {a} {things} {place}, {b} {went}. How many stayed?"), a - b


def _groups(r: random.Random) -> tuple[tuple[str, ...], object]:
    (one, many, items), p, k = r.choice(CONTAINERS), r.randint(2, 9), r.randint(2, 9)
    return (f"Each {one} holds {p} {items}. How many {items} fit in {k} {many}?",
            f"If every {one} has {p} {items}, how many {items} are in {k} {many}?",
            f"There are {k} {many} with {p} {items} in every {one}. How many {items} are there?"), p * k


def _share(r: random.Random) -> tuple[tuple[str, ...], object]:
    items, k, p = r.choice(SHARED), r.randint(2, 6), r.randint(2, 9)
    return (f"{k * p} {items} are shared equally among {k} children. How many does each child get?",
            f"Split {k * p} {items} evenly into {k} groups. How many {items} go in each group?",
            f"{k} friends share {k * p} {items} equally. How many {items} does each friend get?"), p


# money_units

GOODS = (("pencil", "pencils"), ("notebook", "notebooks"), ("sandwich", "sandwiches"), ("ticket", "tickets"),
         ("ice cream", "ice creams"))
ACTIVITIES = ("train ride", "movie", "hike", "flight", "football match", "school trip")
GOOD_PAIRS = (("apples", "pears"), ("pens", "erasers"), ("cups", "plates"), ("stamps", "envelopes"))


def _change(r: random.Random) -> tuple[tuple[str, ...], object]:
    (one, many), name, price, n = r.choice(GOODS), r.choice(NAMES), r.randint(1, 9), r.randint(2, 5)
    bill = r.choice([b for b in (10, 20, 50) if b > price * n])
    return ((f"A {one} costs ${price}. {name} buys {n} {many} and pays with a ${bill} bill. How much change "
             f"does {name} get?"),
            f"{name} pays for {n} {many} at ${price} each with a ${bill} bill. How many dollars come back as change?",
            f"How much change is left from ${bill} after buying {n} {many} that cost ${price} each?"
            ), bill - price * n


def _duration(r: random.Random) -> tuple[tuple[str, ...], object]:
    what, h, m = r.choice(ACTIVITIES), r.randint(2, 5), r.choice((10, 15, 20, 30, 40, 45))
    return (f"A {what} takes {h} hours and {m} minutes. How many minutes is that?",
            f"How long is a {what} of {h} hours and {m} minutes, in minutes?",
            f"A {what} lasts {h} hours {m} minutes. Give its length in minutes."), 60 * h + m


def _bill(r: random.Random) -> tuple[tuple[str, ...], object]:
    (x, y), name, (px, py) = r.choice(GOOD_PAIRS), r.choice(NAMES), r.sample(range(1, 7), 2)
    nx, ny = r.randint(2, 5), r.randint(2, 5)
    return ((f"{x.capitalize()} cost ${px} each and {y} cost ${py} each. How much do {nx} {x} and {ny} {y} "
             f"cost in total?"),
            f"{name} buys {nx} {x} at ${px} each and {ny} {y} at ${py} each. How many dollars does {name} spend?",
            f"What is the total price of {nx} {x} at ${px} each plus {ny} {y} at ${py} each?"), nx * px + ny * py


def _savings(r: random.Random) -> tuple[tuple[str, ...], object]:
    name, s, w = r.choice(NAMES), r.randint(2, 15), r.randint(2, 8)
    return (f"{name} saves ${s} every week. How many dollars has {name} saved after {w} weeks?",
            f"Putting aside ${s} a week, how much money will {name} have after {w} weeks?",
            f"After {w} weeks of saving ${s} per week, how many dollars does {name} have?"), s * w


# comparisons

RECORDS = (("scored", "points"), ("read", "pages"), ("picked", "apples"), ("ran", "laps"), ("sold", "tickets"))


def _greater(r: random.Random) -> tuple[tuple[str, ...], object]:
    (a, b), more = r.sample(range(10, 100), 2), r.random() < 0.5
    greater, bigger, higher = ("greater", "bigger", "higher") if more else ("smaller", "less", "lower")
    return (f"Between {a} and {b}, which number is {greater}?", f"Look at {a} and {b}. Which one is {bigger}?",
            f"Pick the {higher} number: {a} or {b}."), max(a, b) if more else min(a, b)


def _scores(r: random.Random) -> tuple[tuple[str, ...], object]:
    (n1, n2), (did, noun), (v1, v2) = r.sample(PEOPLE, 2), r.choice(RECORDS), r.sample(range(10, 100), 2)
    more = r.random() < 0.5
    most = "more" if more else "fewer"
    return (f"{n1} {did} {v1} {noun} and {n2} {did} {v2}. Who {did} {most}?",
            f"Who {did} {most} {noun}: {n1}, with {v1}, or {n2}, with {v2}?",
            f"{n1}: {v1} {noun}. {n2}: {v2} {noun}. Which of the two {did} {most}?"), n1 if (v1 > v2) == more else n2


def _product(r: random.Random) -> tuple[tuple[str, ...], object]:
    a, b = r.randint(3, 9), r.randint(3, 9)
    c = a * b + r.choice((-1, 1)) * r.randint(1, 5)
    return (f"Is {a} x {b} more or less than {c}? Answer with the product.",
            f"Compare {a} times {b} with {c}, and give the product.",
            f"Work out {a} x {b}, then say if it beats {c}. What is the product?"), a * b


def _months(r: random.Random) -> tuple[tuple[str, ...], object]:
    (i, j), early = r.sample(range(12), 2), r.random() < 0.5
    (earlier, first), m1, m2 = ("earlier", "first") if early else ("later", "last"), MONTHS[i], MONTHS[j]
    return (f"Which comes {earlier} in the year, {m1} or {m2}?",
            f"Of {m1} and {m2}, which month comes {first} in the calendar?",
            f"{m1} or {m2}: which month is {earlier} in the year?"), MONTHS[min(i, j) if early else max(i, j)]


# dates

# (how the question names a day relative to today, that day's offset from today)
REFERENCES = (("the day before yesterday was", -2), ("yesterday was", -1), ("tomorrow is", 1),
              ("the day after tomorrow is", 2))


def _weekday(r: random.Random) -> tuple[tuple[str, ...], object]:
    d, n, forward = r.randrange(7), r.choice((2, 3, 4, 5, 6, 8, 9, 10)), r.random() < 0.5  # not 7: same day
    day, answer = DAYS[d], DAYS[(d + n if forward else d - n) % 7]
    if forward:
        return (f"Today is {day}. What day of the week will it be {n} days from now?",
                f"Which weekday is {n} days after {day}?",
                f"Start on a {day} and count {n} days forward. What day is it?"), answer
    return (f"Today is {day}. What day of the week was it {n} days ago?", f"Which weekday is {n} days before {day}?",
            f"Start on a {day} and count {n} days back. What day is it?"), answer


def _month_steps(r: random.Random) -> tuple[tuple[str, ...], object]:
    m, n, forward = r.randrange(12), r.randint(2, 9), r.random() < 0.5
    month, answer = MONTHS[m], MONTHS[(m + n if forward else m - n) % 12]
    if forward:
        return (f"Which month is {n} months after {month}?", f"Starting in {month}, what month is it {n} months later?",
                f"Count {n} months on from {month}. Which month do you land on?"), answer
    return (f"Which month is {n} months before {month}?", f"Starting in {month}, what month was it {n} months earlier?",
            f"Count {n} months back from {month}. Which month do you land on?"), answer


def _today(r: random.Random) -> tuple[tuple[str, ...], object]:
    (said, offset), d = r.choice(REFERENCES), r.randrange(7)
    day = DAYS[d]
    return (f"If {said} {day}, what day is today?", f"{said.capitalize()} {day}. Which day of the week is it today?",
            f"Suppose {said} {day}. Name today's weekday."), DAYS[(d - offset) % 7]


def _span(r: random.Random) -> tuple[tuple[str, ...], object]:
    w, d = r.randint(2, 6), r.randint(2, 6)
    return (f"A trip lasts {w} weeks and {d} days. How many days is that in total?",
            f"What is {w} weeks and {d} days, counted in days?",
            f"Turn {w} weeks plus {d} days into a number of days."), 7 * w + d


# lists_counting

VOWEL_WORDS = ("garden", "window", "pencil", "basket", "orange", "button", "ticket", "planet", "jacket", "kitten",
               "umbrella", "elephant", "tomato", "island", "rocket", "balloon")
CATEGORIES = (("animal", "animals", ANIMALS), ("color", "colors", COLORS), ("fruit", "fruits", FRUITS))


def _vowels(r: random.Random) -> tuple[tuple[str, ...], object]:
    w = r.choice(VOWEL_WORDS)
    return (f"Count the vowels in the word '{w}'.", f"How many vowels does '{w}' have?",
            f"In the word '{w}', how many letters are vowels?"), sum(c in "aeiou" for c in w)


def _how_many(r: random.Random) -> tuple[tuple[str, ...], object]:
    _, many, pool = r.choice(CATEGORIES)
    items = r.sample(pool, r.randint(3, 7))
    listed = ", ".join(items)
    return (f"Here are some {many}: {listed}. How many are there?", f"Count the {many} in this list: {listed}.",
            f"How many {many} does this list name: {listed}?"), len(items)


def _last(r: random.Random) -> tuple[tuple[str, ...], object]:
    one, _, pool = r.choice(CATEGORIES)
    items = r.sample(pool, r.randint(3, 5))
    listed = ", ".join(items)
    return (f"Which is the last {one} in this list: {listed}?", f"What {one} comes at the end of this list: {listed}?",
            f"Look at this list: {listed}. Which {one} is named last?"), items[-1]


def _middle(r: random.Random) -> tuple[tuple[str, ...], object]:
    numbers = r.sample(range(1, 50), r.choice((3, 5)))
    listed = ", ".join(map(str, numbers))
    return (f"Sort these numbers and give the middle one: {listed}.",
            f"What is the middle value of {listed} once they are sorted?",
            f"Put {listed} in order. Which number ends up in the middle?"), sorted(numbers)[len(numbers) // 2]


# code_output: the twins differ in the words around the code and in how the code is written.

CODE_INTROS = ("What does this Python code print?", "What is the output of this Python program?",
               "Read this Python snippet. Which number does it print?", "Predict what this Python code prints.")


def _code(r: random.Random, codes: tuple[str, str], answer: int) -> tuple[tuple[str, ...], object]:
    intros = r.sample(CODE_INTROS, 2)
    return tuple(f"{intro}\n```python\n{code}\n```" for intro, code in zip(intros, codes, strict=True)), answer


def _update(r: random.Random) -> tuple[tuple[str, ...], object]:
    a, b, c = r.randint(2, 9), r.randint(2, 5), r.randint(1, 9)
    return _code(r, (f"x = {a}\nx = x * {b} + {c}\nprint(x)", f"x = {a}\nx = {c} + {b} * x\nprint(x)"), a * b + c)


def _length(r: random.Random) -> tuple[tuple[str, ...], object]:
    if r.random() < 0.5:
        word = r.choice(VOWEL_WORDS)
        return _code(r, (f"word = '{word}'\nprint(len(word))", f"print(len('{word}'))"), len(word))
    items = r.sample(ANIMALS + FRUITS, r.randint(2, 6))
    return _code(r, (f"items = {items}\nprint(len(items))", f"print(len({items}))"), len(items))


def _loop(r: random.Random) -> tuple[tuple[str, ...], object]:
    start, n, k = r.randint(0, 5), r.randint(2, 4), r.randint(2, 9)
    return _code(r, (f"total = {start}\nfor i in range({n}):\n    total = total + {k}\nprint(total)",
                     f"total = {start}\nfor _ in range({n}):\n    total += {k}\nprint(total)"), start + n * k)


def _sum(r: random.Random) -> tuple[tuple[str, ...], object]:
    numbers = r.sample(range(1, 20), r.randint(2, 4))
    return _code(r, (f"total = 0\nfor n in {numbers}:\n    total += n\nprint(total)", f"print(sum({numbers}))"),
                 sum(numbers))


def _floor_division(r: random.Random) -> tuple[tuple[str, ...], object]:
    a, b = r.randint(10, 60), r.randint(2, 9)
    return _code(r, (f"print({a} // {b})", f"a = {a}\nb = {b}\nprint(a // b)"), a // b)


def _max(r: random.Random) -> tuple[tuple[str, ...], object]:
    numbers = r.sample(range(1, 100), r.randint(3, 4))
    return _code(r, (f"print(max({', '.join(map(str, numbers))}))", f"nums = {numbers}\nprint(max(nums))"),
                 max(numbers))


# factual: free text, no ground truth; the twins are two ways to ask for the same short explanation.

TOPICS = ("photosynthesis", "gravity", "a volcano", "an echo", "a rainbow", "friction", "evaporation", "a shadow",
          "a fossil", "an island", "a magnet", "a desert")
THINGS = ("a screwdriver", "a broom", "a stapler", "a ruler", "a flashlight", "a sponge", "a whistle", "a padlock",
          "a funnel", "a ladle", "a paintbrush", "a doormat")
HABITS = ("we wear coats in winter", "people brush their teeth", "cars need fuel", "birds build nests",
          "we wash our hands", "plants have roots", "ships carry anchors", "roads have traffic lights",
          "people wear sunglasses", "bees visit flowers", "houses have roofs", "we cook meat")


def _define(r: random.Random) -> tuple[tuple[str, ...], object]:
    t = r.choice(TOPICS)
    return (f"In one sentence, what is {t}?", f"Briefly define {t}.", f"Give a one-sentence definition of {t}.",
            f"What is meant by {t}? Keep it to one sentence."), None


def _use(r: random.Random) -> tuple[tuple[str, ...], object]:
    t = r.choice(THINGS)
    return (f"Name one use of {t}, in one short sentence.", f"What can you do with {t}? Answer in one sentence.",
            f"Give one reason someone might need {t}.", f"In a few words, what is {t} good for?"), None


def _reason(r: random.Random) -> tuple[tuple[str, ...], object]:
    h = r.choice(HABITS)
    return (f"Briefly, why do {h}?", f"In one short sentence, give the reason {h}.",
            f"What is the main reason {h}? One sentence, please.", f"Why is it that {h}? Answer briefly."), None


# In generation order; appending a family leaves the others' items as they were.
FAMILIES: dict[str, tuple[Twins, ...]] = {
    "word_problems": (_made, _left, _groups, _share),
    "money_units": (_change, _duration, _bill, _savings),
    "comparisons": (_greater, _scores, _product, _months),
    "dates": (_weekday, _month_steps, _today, _span),
    "lists_counting": (_vowels, _how_many, _last, _middle),
    "code_output": (_update, _length, _loop, _sum, _floor_division, _max),
    "factual": (_define, _use, _reason),
}


def _draw_twins(r: random.Random, templates: tuple[Twins, ...], seen: set[str],
                avoid: frozenset[str] = frozenset()) -> tuple[str, str, object, tuple[str, ...]]:
    """Two wordings of a question not drawn before, none of whose wordings is in ``avoid``; and all its wordings."""
    for _ in range(1000):
        wordings, answer = r.choice(templates)(r)
        first, second = r.sample(wordings, 2)
        if first not in seen and second not in seen and avoid.isdisjoint(wordings):
            seen.update((first, second))
            return first, second, answer, wordings
    raise RuntimeError("templates exhausted: too many pairs asked of one family")


def _generate_family(family: str, seed: int, n_pairs: int,
                     avoid: frozenset[str] = frozenset()) -> tuple[list[Task], set[str]]:
    """A family's twins, and every wording of every question drawn (the two asked and the others)."""
    r, seen, tasks, wordings = random.Random(f"{seed}:{family}"), set[str](), [], set[str]()
    for p in range(n_pairs):
        first, second, answer, all_wordings = _draw_twins(r, FAMILIES[family], seen, avoid)
        wordings.update(all_wordings)
        for question in (first, second):
            tasks.append(Task(f"{family}-{len(tasks):04d}", family, question, None if answer is None else str(answer),
                              scoring_of(answer), pair=f"{family}-p{p:04d}"))
    return tasks, wordings


def _chosen(per_family: int, families: Sequence[str] | None) -> list[str]:
    if per_family < 0 or per_family % 2:
        raise ValueError(f"per_family must be an even number >= 0 (items come in twin pairs), got {per_family}")
    chosen = list(FAMILIES) if families is None else list(families)
    if unknown := [f for f in chosen if f not in FAMILIES]:
        raise ValueError(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    return [f for f in FAMILIES if f in chosen]


def generate_families(seed: int = 11, per_family: int = 60, families: Sequence[str] | None = None,
                      avoid: frozenset[str] = frozenset()) -> list[Task]:
    """``per_family`` items of each family (all by default, in ``FAMILIES`` order): twins, one after the other.

    Each family draws from its own generator seeded by ``seed`` and its name, so its items do not depend on
    which other families are asked for. A question any of whose wordings is in ``avoid`` is never drawn.
    """
    return [t for f in _chosen(per_family, families) for t in _generate_family(f, seed, per_family // 2, avoid)[0]]


def benchmark_wordings(seed: int = 11, per_family: int = 60) -> frozenset[str]:
    """Every wording of every question of a generation (by default the shipped benchmark's), asked or not: what a
    calibration set must avoid to share no question with the benchmark, whatever its wording."""
    return frozenset(w for f in FAMILIES for w in _generate_family(f, seed, per_family // 2)[1])


def load_families(path: Path | None = None) -> list[Task]:
    """Read a family task file, by default the shipped one."""
    return load_tasks(FAMILIES_PATH if path is None else path)


def main() -> None:
    """Regenerate the shipped family task file from the default seed."""
    tasks = generate_families()
    print(f"wrote {len(tasks)} tasks to {write_tasks(tasks, FAMILIES_PATH)}")


if __name__ == "__main__":
    main()
