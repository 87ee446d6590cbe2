"""Shared output of the benchmarks: a JSON file and a summary with spread."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and extremes of repeated measurements."""
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {"median": statistics.median(ordered), "q1": q[0], "q3": q[2], "min": ordered[0], "max": ordered[-1],
            "n": len(ordered)}


def percentiles(values: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max (nearest rank: numpy's ``inverted_cdf``); empty when there are no values."""
    if not values:
        return {}
    p50, p90, p99 = np.percentile(values, [50, 90, 99], method="inverted_cdf")
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(np.max(values))}


def interval(figure: dict[str, float], scale: float = 1.0, digits: int = 1) -> str:
    """``value [lo, hi]`` of a figure with its 95% interval, scaled; ``-`` when it has no value."""
    if math.isnan(figure["value"]):
        return "-"
    v, lo, hi = (figure[k] * scale for k in ("value", "lo", "hi"))
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def write_json(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


@contextmanager
def figure(path: Path, title: str, ylabel: str, size: tuple[float, float], ncols: int = 1,
           legend_outside: bool = False) -> Iterator[Any]:
    """Yield the axes of a new figure (a list when ``ncols`` > 1); on exit add legends (right of the axes when
    ``legend_outside``) and write a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=size, squeeze=False)
    panels = list(axes[0])
    try:
        yield panels[0] if ncols == 1 else panels
        fig.suptitle(title)
        for ax in panels:
            if ylabel:
                ax.set_ylabel(ylabel)
            ax.legend(fontsize=7, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if legend_outside else {}))
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
