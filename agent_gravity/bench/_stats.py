"""95% confidence intervals for benchmark figures: Wilson for rates, paired bootstrap for means and savings."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054
RESAMPLES = 2000


def wilson(successes: int, n: int) -> dict[str, float]:
    """A rate with its Wilson score interval (sound near 0% and 100%, where the normal one is not)."""
    if n == 0:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    p = successes / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return {"value": p, "lo": max(0.0, centre - half), "hi": min(1.0, centre + half), "n": n}


def _indices(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(RESAMPLES, n))


def mean_ci(values: Sequence[float], seed: int = 0) -> dict[str, float]:
    """The mean with a percentile bootstrap interval over items."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    means = data[_indices(data.size, seed)].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return {"value": float(data.mean()), "lo": float(lo), "hi": float(hi), "n": int(data.size)}


def ratio_ci(baseline: Sequence[float], method: Sequence[float], seed: int = 0) -> dict[str, float]:
    """``sum(method) / sum(baseline)`` over the same items, with a paired bootstrap interval."""
    a, b = np.asarray(baseline, dtype=np.float64), np.asarray(method, dtype=np.float64)
    if a.size == 0 or a.size != b.size or a.sum() == 0:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": int(a.size)}
    idx = _indices(a.size, seed)
    ratios = b[idx].sum(axis=1) / np.maximum(a[idx].sum(axis=1), 1e-9)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return {"value": float(b.sum() / a.sum()), "lo": float(lo), "hi": float(hi), "n": int(a.size)}


def saving_ci(baseline: Sequence[float], method: Sequence[float], seed: int = 0) -> dict[str, float]:
    """``1 - sum(method) / sum(baseline)`` over the same items, with a paired bootstrap interval."""
    ratio = ratio_ci(baseline, method, seed)
    return {"value": 1 - ratio["value"], "lo": 1 - ratio["hi"], "hi": 1 - ratio["lo"], "n": ratio["n"]}


def difference_ci(baseline: Sequence[float], method: Sequence[float], seed: int = 0) -> dict[str, float]:
    """``mean(method) - mean(baseline)`` over the same items (e.g. an accuracy change), paired bootstrap."""
    a, b = np.asarray(baseline, dtype=np.float64), np.asarray(method, dtype=np.float64)
    if a.size == 0 or a.size != b.size:
        return {"value": math.nan, "lo": math.nan, "hi": math.nan, "n": int(a.size)}
    diffs = (b - a)[_indices(a.size, seed)].mean(axis=1)
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"value": float((b - a).mean()), "lo": float(lo), "hi": float(hi), "n": int(a.size)}
