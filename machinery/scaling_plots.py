"""The plots of scaling.py's fits: the lecture's log-log pictures, drawn with matplotlib to a PNG.

`plot_runs` (`python scaling.py fit runs.jsonl --plot fit.png`) draws two panels: loss against N per
IsoFLOP budget with each budget's parabola and minimum, and the compute-optimal N against compute
with the points and lines of Approaches 1-3. machinery/sweep.py's plot reuses them.

Depends on numpy, scaling.py (the fits), fileio.py (write_atomic); matplotlib inside the functions.
"""

from __future__ import annotations

import math
import pathlib
from typing import Sequence

import numpy as np

from machinery import fileio
from scaling import (
    AllocationLaw,
    FitReport,
    Run,
    ScalingError,
    frontier,
    group_close,
    isoflop_minima,
)


def save_png(fig, path) -> pathlib.Path:
    """Lay out, write and close a matplotlib figure, never leaving a half-written PNG
    (fileio.write_atomic)."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise ScalingError(
            f"{str(path)!r} is a directory: give a file name for the plot, e.g. {path / 'fit.png'}"
        )
    fig.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return fileio.write_atomic(
            path,
            lambda f: fig.savefig(f, format="png", dpi=120),
            error=ScalingError,
            fix="choose another path for the plot",
        )
    except OSError as e:
        raise ScalingError(
            f"cannot write the plot {str(path)!r} ({e.strerror}); choose another path"
        ) from None
    finally:
        pyplot().close(fig)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported here: only the plots need
    matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_isoflop_curves(ax, runs: Sequence[Run]) -> None:
    """Loss against N per IsoFLOP budget, each budget's parabola in log N and its vertex (a
    star)."""
    for budget, group in group_close(runs, key=lambda r: r.budget).items():
        group = sorted(group, key=lambda r: r.params)
        (line,) = ax.plot(
            [r.params for r in group], [r.loss for r in group], "o", ms=4, label=f"C = {budget:.2g}"
        )
        for _, n_star, coef in isoflop_minima(group):
            x = np.linspace(math.log(group[0].params), math.log(group[-1].params), 100)
            ax.plot(np.exp(x), np.polyval(coef, x), "-", color=line.get_color(), lw=1)
            ax.plot(
                [n_star], [np.polyval(coef, math.log(n_star))], "*", color=line.get_color(), ms=10
            )
    ax.set_xlabel("parameters N")


def draw_allocations(ax, runs: Sequence[Run], laws: dict, computes: np.ndarray) -> None:
    """N_opt against compute: the points Approaches 1 and 2 fit, and each fitted law over
    `computes`."""
    front = frontier(runs)
    ax.plot(
        [r.compute for r in front],
        [r.params for r in front],
        "ks",
        ms=5,
        label="Approach 1: best run per C",
    )
    minima = isoflop_minima(runs)
    if minima:
        ax.plot(
            [m[0] for m in minima],
            [m[1] for m in minima],
            "r*",
            ms=9,
            label="Approach 2: IsoFLOP minima",
        )
    for key, style in (("approach1", "k--"), ("approach2", "r-"), ("approach3", "b:")):
        law = laws.get(key)
        if isinstance(law, AllocationLaw):
            ax.plot(computes, law.params_at(computes), style, label=f"{key}: N_opt ∝ C^{law.a:.2f}")
    ax.set_xlabel("compute C (FLOPs)")
    ax.set_ylabel("compute-optimal parameters N_opt")


def log_axes(ax, ylabel: str | None = None) -> None:
    """Log-log axes with a grid and a legend; with a ylabel (a loss axis), its ticks as plain
    numbers."""
    import matplotlib.ticker

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    if ylabel:
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_ylabel(ylabel)


def plot_runs(runs: Sequence[Run], report: FitReport, path) -> pathlib.Path:
    """Two log-log panels. Left: loss against N per IsoFLOP budget with its parabola and minimum.
    Right: the compute-optimal N against compute, the points each approach used and the three fitted
    lines."""
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(13, 5))
    draw_isoflop_curves(left, runs)
    log_axes(left, "loss (nats/token)")
    computes = np.array([r.compute for r in runs])
    draw_allocations(
        right,
        runs,
        report.laws,
        np.logspace(math.log10(computes.min()), math.log10(max(computes.max(), report.target)), 50),
    )
    log_axes(right)
    return save_png(fig, path)
