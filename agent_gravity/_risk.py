"""Risk control for calibration: Learn-then-Test over an ordered grid, with a finite-sample guarantee.

Each candidate configuration has a 0/1 loss per calibration item (the answer was lost). For a
candidate the null hypothesis is "its expected loss exceeds ``epsilon``"; the exact binomial tail
gives a valid p-value for a bounded 0/1 loss on items exchangeable with new ones. Candidates are
tested in a fixed order, from the most conservative to the most aggressive, each at level
``delta``, stopping at the first that cannot be rejected (fixed-sequence testing, which controls the
family-wise error at ``delta``). Every rejected candidate then has, with probability at least
``1 - delta``, expected loss at most ``epsilon``; the chosen one is the rejected candidate that
saves the most. This is Learn-then-Test (Angelopoulos, Bates et al., 2021) with the binomial test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def binomial_cdf(k: int, n: int, p: float) -> float:
    """``P(Binomial(n, p) <= k)``, exact (summed in log space, safe for thousands of trials)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def p_value(losses: int, n: int, epsilon: float) -> float:
    """Evidence against "expected loss > epsilon" after ``losses`` of ``n``: small means the risk is low."""
    return binomial_cdf(losses, n, epsilon)


def upper_bound(losses: int, n: int, delta: float) -> float:
    """The one-sided Clopper-Pearson upper bound: expected loss <= this with probability >= 1 - delta."""
    if n == 0:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection to float precision; the tail falls as p grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if binomial_cdf(losses, n, mid) > delta else (lo, mid)
    return hi


@dataclass(frozen=True)
class Tested:
    """One candidate's test: its losses, p-value, bound and whether it passed."""

    name: str
    losses: int
    n: int
    p_value: float
    bound: float
    saving: float
    passed: bool
    tested: bool
    """False for candidates after the first failure: fixed-sequence testing never reaches them."""


@dataclass(frozen=True)
class Selection:
    """The outcome of a calibration: the chosen candidate (None when none met the bound) and every test."""

    chosen: str | None
    epsilon: float
    delta: float
    tests: tuple[Tested, ...]

    @property
    def met(self) -> bool:
        return self.chosen is not None

    def test(self, name: str) -> Tested:
        return next(t for t in self.tests if t.name == name)


def check_levels(epsilon: float, delta: float) -> None:
    """ValueError unless both are probabilities strictly between 0 and 1."""
    for label, value in (("epsilon", epsilon), ("delta", delta)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{label} must be strictly between 0 and 1, got {value}")


def learn_then_test(candidates: Sequence[tuple[str, Sequence[int], float]], epsilon: float = 0.05,
                    delta: float = 0.1) -> Selection:
    """Test ``(name, per-item 0/1 losses, saving)`` in the given order (most conservative first).

    Returns the passed candidate with the largest saving; ``chosen`` is None when the first
    candidate already fails, so the caller keeps its conservative defaults.
    """
    check_levels(epsilon, delta)
    if not candidates:
        raise ValueError("risk control needs at least one candidate")
    tests, going = [], True
    for name, losses, saving in candidates:
        if any(v not in (0, 1) for v in losses):
            raise ValueError(f"candidate {name!r}: losses must be 0 or 1 per item")
        k, n = int(sum(losses)), len(losses)
        p = p_value(k, n, epsilon)
        passed = going and n > 0 and p <= delta
        tests.append(Tested(name, k, n, p, upper_bound(k, n, delta), saving, passed, going))
        going = passed
    ok = [t for t in tests if t.passed]
    chosen = max(ok, key=lambda t: t.saving).name if ok else None
    return Selection(chosen, epsilon, delta, tuple(tests))


def items_needed(epsilon: float, delta: float) -> int:
    """The fewest items on which a candidate with no loss at all passes: below it nothing can be certified."""
    check_levels(epsilon, delta)
    return math.ceil(math.log(delta) / math.log1p(-epsilon))
