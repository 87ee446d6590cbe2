"""The task families: reproducible, paired with paraphrase twins, right, unlike the savings set, and scorable."""

import contextlib
import io
import re
from collections import Counter, defaultdict

import pytest

from agent_gravity.bench.families import (
    FAMILIES,
    FAMILIES_PATH,
    generate_families,
    load_families,
)
from agent_gravity.bench.tasks import (
    ANSWER_WORDS,
    Task,
    extract_answer,
    generate_tasks,
    is_correct,
    load_tasks,
    normalize,
    write_tasks,
)

TASKS = generate_families()
# Written out here rather than imported, so the checks do not share the generator's tables.
WEEK = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
YEAR = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
        "november", "december"]
# Offset from today of the day a question names, by how it names it; the longer phrases first.
RELATIVE_DAYS = (("day before yesterday", -2), ("day after tomorrow", 2), ("yesterday", -1), ("tomorrow", 1))
# What each code template's snippets, in either of their forms, contain; the first that matches names it.
CODE_TEMPLATES = {"length": r"len\(", "max": r"max\(", "division": "//", "loop": r"range\(", "update": "x = ",
                  "sum": r"sum\(|for n in"}


def of_kind(kind: str) -> list[Task]:
    return [t for t in TASKS if t.kind == kind]


def numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def opening(question: str) -> tuple[str, ...]:
    """The first four words, with numbers and answer words (names, days, colors...) masked: a template's start."""
    return tuple("#" if w.isdigit() else "<w>" if w in ANSWER_WORDS else w for w in normalize(question).split()[:4])


def test_shipped_file_is_the_default_generation(tmp_path):
    assert load_families() == load_tasks(FAMILIES_PATH) == TASKS
    assert write_tasks(TASKS, tmp_path / "fresh.jsonl").read_text() == FAMILIES_PATH.read_text()


def test_generation_is_seeded():
    assert generate_families(seed=11) == TASKS
    assert generate_families(seed=12) != TASKS
    assert len(generate_families(seed=3, per_family=4)) == 4 * len(FAMILIES)


def test_at_least_seven_families_of_sixty_items():
    counts = Counter(t.kind for t in TASKS)
    assert len(FAMILIES) >= 7 and list(counts) == list(FAMILIES)
    assert all(n >= 60 for n in counts.values())


def test_ids_and_questions_are_unique():
    assert len({t.id for t in TASKS}) == len({t.question for t in TASKS}) == len(TASKS)
    assert all(re.fullmatch(rf"{t.kind}-\d{{4}}", t.id) and re.fullmatch(rf"{t.kind}-p\d{{4}}", t.pair)
               for t in TASKS)


def test_every_item_has_one_differently_worded_twin():
    pairs = defaultdict(list)
    for task in TASKS:
        pairs[task.pair].append(task)
    assert len(pairs) == len(TASKS) // 2
    for a, b in pairs.values():
        assert (a.kind, a.answer, a.scoring) == (b.kind, b.answer, b.scoring) and a.question != b.question, a
        if a.kind == "code_output":  # the twins differ in their words and in how the code is written
            (intro_a, code_a, _), (intro_b, code_b, _) = a.question.split("```"), b.question.split("```")
            assert intro_a != intro_b and code_a != code_b, a
        else:
            assert opening(a.question) != opening(b.question), a
            assert sorted(numbers(a.question)) == sorted(numbers(b.question)), a
        if a.scoring == "word":
            named = [set(normalize(t.question).split()) & ANSWER_WORDS for t in (a, b)]
            assert named[0] == named[1], a


def test_families_do_not_reuse_the_savings_templates():
    savings = {opening(t.question) for t in generate_tasks(seed=0)}
    for task in TASKS:
        assert opening(task.question) not in savings, task


def test_per_family_must_be_even():
    with pytest.raises(ValueError, match="even"):
        generate_families(per_family=5)
    with pytest.raises(ValueError, match="unknown families"):
        generate_families(families=["poetry"])


def test_a_family_does_not_depend_on_the_others():
    assert generate_families(families=["dates"]) == of_kind("dates")
    subset = generate_families(families=["factual", "word_problems"])
    assert subset == of_kind("word_problems") + of_kind("factual")


def word_problem(q: str) -> tuple[str, int]:
    a, b = numbers(q)
    if re.search(r"equally|evenly", q):
        return "share", max(a, b) // min(a, b)
    if re.search(r"\b(each|every)\b", q, re.IGNORECASE):
        return "groups", a * b
    if re.search(r"remain|still|stayed", q):
        return "left", a - b
    assert re.search(r"afternoon|after lunch", q), q
    return "made", a + b


def money_units(q: str) -> tuple[str, int]:
    dollars = [int(n) for n in re.findall(r"\$(\d+)", q)]
    counts = [int(n) for n in re.findall(r"(?<![$\d])(\d+)", q)]
    if "change" in q:
        (n,) = counts
        return "change", max(dollars) - min(dollars) * n
    if "hours" in q:
        hours, minutes = counts
        return "duration", 60 * hours + minutes
    if "week" in q:
        ((per_week,), (weeks,)) = dollars, counts
        return "savings", per_week * weeks
    return "bill", sum(n * price for n, price in zip(counts, dollars, strict=True))


def comparison(q: str) -> tuple[str, str]:
    if "product" in q:
        a, b, _ = numbers(q)
        return "product", str(a * b)
    words = re.findall(r"[A-Za-z]+", q)
    if months := [YEAR.index(w.lower()) for w in words if w.lower() in YEAR]:
        early = re.search(r"earlier|first", q)
        return "months", YEAR[min(months) if early else max(months)]
    values = numbers(q)
    if names := [w for w in words if w[0].isupper() and w.lower() in ANSWER_WORDS]:
        best = (max if "more" in q else min)(values)
        return "scores", names[values.index(best)].lower()
    return "greater", str((max if re.search(r"greater|bigger|higher", q) else min)(values))


def date(q: str) -> tuple[str, str]:
    low = q.lower()
    day = next((WEEK.index(w) for w in re.findall(r"[a-z]+", low) if w in WEEK), None)
    if m := re.search(r"(\d+) days (from now|after|forward|ago|before|back)", low):
        sign = 1 if m[2] in ("from now", "after", "forward") else -1
        return "weekday", WEEK[(day + sign * int(m[1])) % 7]
    if m := re.search(r"(\d+) months (after|later|on from|before|earlier|back from)", low):
        month = next(YEAR.index(w) for w in re.findall(r"[a-z]+", low) if w in YEAR)
        sign = 1 if m[2] in ("after", "later", "on from") else -1
        return "month_steps", YEAR[(month + sign * int(m[1])) % 12]
    if day is not None:
        offset = next(o for phrase, o in RELATIVE_DAYS if phrase in low)
        return "today", WEEK[(day - offset) % 7]
    weeks, days = numbers(q)
    return "span", str(7 * weeks + days)


def list_or_count(q: str) -> tuple[str, str]:
    if m := re.search(r"'(\w+)'", q):
        return "vowels", str(sum(c in "aeiou" for c in m[1]))
    if "middle" in q:
        values = sorted(numbers(q))
        return "middle", str(values[len(values) // 2])
    items = re.search(r": ([\w, ]+)[.?]", q)[1].split(", ")
    if "How many" in q or "Count" in q:
        return "how_many", str(len(items))
    return "last", items[-1]


def code_output(q: str) -> tuple[str, str]:
    code = re.search(r"```python\n(.*)\n```", q, re.DOTALL)[1]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, {})  # noqa: S102 - the generator's own snippets, run to check their answers
    template = next(name for name, pattern in CODE_TEMPLATES.items() if re.search(pattern, code))
    return template, printed.getvalue().strip()


CHECKS = {"word_problems": (word_problem, 4), "money_units": (money_units, 4), "comparisons": (comparison, 4),
          "dates": (date, 4), "lists_counting": (list_or_count, 4), "code_output": (code_output, 6)}


@pytest.mark.parametrize("family", list(CHECKS))
def test_answers_are_right_and_every_template_is_used(family):
    check, n_templates = CHECKS[family]
    used = set()
    for task in of_kind(family):
        template, expected = check(task.question)
        assert task.answer.lower() == str(expected).lower(), task
        used.add(template)
    assert len(used) == n_templates


def test_factual_items_are_free_text():
    assert all(t.answer is None and t.scoring == "free_text" for t in of_kind("factual"))
    assert {opening(t.question)[0] for t in of_kind("factual")} >= {"in", "briefly", "give", "what", "name", "why"}


def test_every_answer_scores_itself_correct():
    for task in TASKS:
        if task.answer is not None:
            assert is_correct(task, task.answer) and is_correct(task, f"The answer is {task.answer}."), task
            if task.scoring == "number":
                assert int(task.answer) >= 0, task


def test_date_answers_skip_the_day_the_question_names():
    task = next(t for t in of_kind("dates") if t.question.startswith("If yesterday was"))
    named = task.question.split()[3].rstrip(",")
    assert extract_answer(task, f"Yesterday was {named}, so today is {task.answer}.") == task.answer.lower()
    months = next(t for t in of_kind("comparisons") if t.scoring == "word" and t.answer.lower() in YEAR)
    assert is_correct(months, f"{months.answer} comes {'before' if 'earlier' in months.question else 'after'}.")


def test_pair_round_trips_and_is_omitted_when_absent(tmp_path):
    path = write_tasks(TASKS[:2], tmp_path / "pairs.jsonl")
    assert load_tasks(path) == TASKS[:2] and '"pair": "word_problems-p0000"' in path.read_text()
    plain = Task("t-0000", "arithmetic", "q?", "1", "number")
    assert '"pair"' not in write_tasks([plain], tmp_path / "plain.jsonl").read_text()
    for bad in ('{"id": "x", "kind": "k", "question": "q", "answer": "1", "scoring": "number", "pair": 3}',
                '{"id": "x", "kind": "k", "question": "q", "answer": "1", "scoring": "number", "twin": "p"}'):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match="line 1"):
            load_tasks(path)


def test_a_calibration_set_shares_no_question_with_the_benchmark_in_any_wording():
    from agent_gravity.bench.families import benchmark_wordings

    avoid = benchmark_wordings()
    shipped = load_families()
    assert {t.question for t in shipped} <= avoid and len(avoid) > len(shipped), "unasked wordings count too"
    calibration = generate_families(12, 20, avoid=avoid)
    assert len(calibration) == 140 and not {t.question for t in calibration} & avoid
    plain = generate_families(12, 20)
    assert {t.question for t in plain} & avoid, "without avoid, seed 12 repeats some benchmark questions"
