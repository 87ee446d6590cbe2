"""Multi-step agent tasks with known answers: a calculator and a lookup over a small local table.

The tools are real: the calculator evaluates arithmetic safely, the lookup reads a stock table.
Tasks are generated from a seed, so every run and every machine sees the same set.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from langchain_core.tools import tool
from pydantic import BaseModel, Field

STOCK: dict[str, int] = {
    "apples": 42, "pears": 17, "plums": 63, "lemons": 25, "melons": 8, "grapes": 91, "kiwis": 36,
    "mangos": 14, "peaches": 55, "cherries": 120, "figs": 29, "limes": 47,
}
"""The local table: units in stock per item."""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> float:
    """Value of an arithmetic expression of numbers, + - * / and parentheses; ValueError otherwise."""
    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression element {ast.dump(node)[:40]}")
    try:
        return walk(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(f"cannot evaluate {expression!r}: {exc}") from exc


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


class _Expression(BaseModel):
    expression: str = Field(description="numbers joined by + - * / and parentheses, e.g. 42 + 17",
                            pattern=r"^[0-9+\-*/(). ]{1,40}$")


class _Item(BaseModel):
    item: Literal[tuple(STOCK)] = Field(description="an item of the stock table")  # type: ignore[valid-type]


@tool(args_schema=_Expression)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression, for example 42 + 17 or 3 * (8 - 2)."""
    try:
        return _number(evaluate(expression))
    except ValueError as exc:
        return f"Error: {exc}. Write numbers and + - * / only."


@tool(args_schema=_Item)
def lookup(item: str) -> str:
    """Look up how many units of an item (for example apples) are in stock."""
    key = item.strip().lower()
    if key in STOCK:
        return f"{key}: {STOCK[key]} in stock"
    return f"Error: no item {item!r}; items are {', '.join(STOCK)}."


class FinalAnswer(BaseModel):
    """Give the final answer to the user's question."""

    answer: float = Field(description="the final answer, a number")


@dataclass(frozen=True)
class AgentTask:
    """One task: the question and its known answer."""

    id: str
    question: str
    answer: str
    steps: int
    """Tool calls an ideal agent makes."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _task(rng: random.Random, i: int) -> AgentTask:
    a, b = rng.sample(sorted(STOCK), 2)
    kind = i % 4
    if kind == 3:
        return AgentTask(f"lookup-{i}", f"How many {a} are in stock?", _number(STOCK[a]), 1)
    if kind == 0:
        return AgentTask(f"sum-{i}", f"How many {a} and {b} are in stock together?", _number(STOCK[a] + STOCK[b]), 3)
    if kind == 1:
        n = rng.randint(2, 5)
        return AgentTask(f"times-{i}", f"How many {a} are in stock, times {n}?", _number(STOCK[a] * n), 2)
    return AgentTask(f"diff-{i}", f"How many more {a} than {b} are in stock?", _number(STOCK[a] - STOCK[b]), 3)


def generate_agent_tasks(n: int = 60, seed: int = 7) -> list[AgentTask]:
    """``n`` tasks from ``seed``: lookups, and sums, multiples and differences of table values."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    rng = random.Random(seed)
    return [_task(rng, i) for i in range(n)]


# A worked example would help a larger model; the 135M one copies its numbers instead, so there is none.
SYSTEM_PROMPT = ("You answer questions about the stock table. First use lookup to read each item's stock, then "
                 "calculator for any arithmetic, then FinalAnswer with the result.")

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def answer_number(text: str) -> str | None:
    """The last number in an answer text, as the tasks write it; None when there is none."""
    found = _NUMBER.findall(text.replace(",", ""))
    return _number(float(found[-1])) if found else None
