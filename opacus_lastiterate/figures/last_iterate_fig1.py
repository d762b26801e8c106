"""Last-iterate paper, Figure 1: the heuristic against its baselines over the number of steps.

Steinke et al., "The Last Iterate Advantage" (arXiv 2410.06186), Figure 1 plots, against T,
the epsilon at delta = 1e-6 of the last-iterate heuristic, the standard composition analysis
(all iterates released) and full-batch DP-GD with the same expected step and noise, in
several (q, sigma) regimes. The paper's text does not list the regimes of its panels; we draw
three of our choosing:

* (a) q = 0.01, sigma = 1: a common regime;
* (b) q = 0.1, sigma = 1: the regime of the paper's worked example (T = 3: epsilon 2.222;
  T = 1: 2.182);
* (c) q = 0.01, sigma = 0.5: the heuristic falls, then rises with T (the non-monotone case
  the paper shows in its Figure 1c); the robust heuristic, max over t <= T, is drawn too.

Every number is the registry's (``privacy_model(name, run)``,
:mod:`opacus_lastiterate.analysis.privacy_models`); nothing is simulated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opacus_lastiterate.analysis.baselines.composition import (
    DEFAULT_DISCRETIZATION,
)
from opacus_lastiterate.analysis.comparison import EpsilonComparison
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.figures._base import Column, FigureResult
from opacus_lastiterate.figures._plotting import OKABE_ITO, legend_below, panel_axes, save

__all__ = [
    "compute",
    "plot",
]

NAME = "last-iterate-fig1"
"""The figure's name on the command line."""
DELTA = 1e-6
"""The delta of every epsilon (the paper's)."""
REGIMES: tuple[tuple[str, float, float], ...] = (
    ("(a)", 0.01, 1.0),
    ("(b)", 0.1, 1.0),
    ("(c)", 0.01, 0.5),
)
"""(panel, sample rate q, noise multiplier sigma)."""

STEPS = {
    "quick": (1, 3, 10, 100, 1000),
    "default": (1, 2, 3, 5, 10, 20, 50, 100, 300, 1000, 3000, 10000),
    "full": (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000,
             1500, 2000, 3000, 5000, 7000, 10000),
}
"""The values of T drawn, per size."""

_INTERVAL = {"quick": 1e-3, "default": DEFAULT_DISCRETIZATION, "full": DEFAULT_DISCRETIZATION}


def steps_grid(steps: int, points: int = 12) -> list[int]:
    """About ``points`` values of t from 1 to ``steps``, geometrically spaced, ending at T."""
    if steps <= points:
        return list(range(1, steps + 1))
    ratio = steps ** (1.0 / (points - 1))
    return sorted({min(steps, max(1, round(ratio**i))) for i in range(points)} | {steps})


def curve(
    delta: float,
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: list[int] | tuple[int, ...],
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> list[dict[str, Any]]:
    """Heuristic, robust heuristic, standard and full-batch epsilon at each T of ``steps``."""
    rows: list[dict[str, Any]] = []
    for t in steps:
        run = DPSGDRun.constant(steps=t, sample_rate=sample_rate, noise_multiplier=noise_multiplier)
        standard = privacy_model(
            "standard", run, value_discretization_interval=value_discretization_interval
        )
        rows.append(
            {
                "sample_rate": sample_rate,
                "noise_multiplier": noise_multiplier,
                "steps": t,
                "heuristic": privacy_model("heuristic", run).epsilon(delta),
                "robust_heuristic": privacy_model("robust_heuristic", run).epsilon(delta),
                "standard": standard.epsilon(delta),
                "full_batch": privacy_model("full_batch", run).epsilon(delta),
            }
        )
    return rows


def compute(size: str = "default") -> FigureResult:
    """All curves of the figure at the T of ``STEPS[size]`` ("quick", "default" or "full";
    "quick" also uses a coarser PLD grid, 1e-3, for the standard epsilon)."""
    interval = _INTERVAL[size]
    rows = []
    for panel, q, sigma in REGIMES:
        for row in curve(
            DELTA, sample_rate=q, noise_multiplier=sigma, steps=STEPS[size],
            value_discretization_interval=interval,
        ):
            rows.append({"panel": f"{panel} q = {q:g}, sigma = {sigma:g}", **row})
    labels = {k: EpsilonComparison.LABELS[k] for k in
              ("heuristic", "robust_heuristic", "standard", "full_batch")}
    labels["standard"] = (
        f"standard composition (all iterates released): dp_accounting PLD with interval "
        f"{interval:g}, an upper bound"
    )
    return FigureResult(
        name=NAME,
        title=f"Last-iterate paper, Figure 1: epsilon at delta = {DELTA:g} against T",
        settings={
            "delta": DELTA,
            "regimes": [{"panel": p, "sample_rate": q, "noise_multiplier": s}
                        for p, q, s in REGIMES],
            "steps": list(STEPS[size]),
            "value_discretization_interval": interval,
            "size": size,
        },
        columns=(
            Column("steps", "T", "d"),
            Column("heuristic", "heuristic", ".4f"),
            Column("robust_heuristic", "robust", ".4f"),
            Column("standard", "standard", ".4f"),
            Column("full_batch", "full batch", ".4f"),
        ),
        rows=rows,
        labels=labels,
        notes=(
            "The paper's worked example (q = 0.1, sigma = 1): T = 1 gives 2.182, T = 3 gives "
            "2.222 (panel (b)).",
            "The regimes are ours: the paper's text does not list those of its panels.",
        ),
        plot=plot,
        group="panel",
    )


_STYLES = (  # key, line style, colour, marker (open markers: visible where curves coincide)
    ("standard", "-", OKABE_ITO[0], "s", "standard (all iterates): upper bound"),
    ("heuristic", "-", OKABE_ITO[5], "o", "last-iterate heuristic"),
    ("robust_heuristic", ":", OKABE_ITO[4], "x", "robust heuristic (max over t <= T)"),
    ("full_batch", "--", OKABE_ITO[3], "^", "full-batch DP-GD (exact)"),
)


def draw_panel(ax: Any, rows: list[dict[str, Any]], delta: float, title: str) -> None:
    """The four curves of ``rows`` (from :func:`curve`) on one log-log axis."""
    steps = [r["steps"] for r in rows]
    every = max(1, len(steps) // 12)  # markers on a dozen points, the line through all
    for key, line, colour, marker, label in _STYLES:
        ax.plot(steps, [r[key] for r in rows], line, color=colour, marker=marker,
                markevery=every, ms=5, mfc="none" if marker != "x" else colour, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of steps T (log scale)")
    ax.set_ylabel(f"epsilon at delta = {delta:g} (no unit, log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)


def plot(result: FigureResult, path: Path) -> None:
    """One panel per regime, log-log: standard, heuristic, robust heuristic, full batch."""
    fig, panels = panel_axes(result.rows, 5.0, 4.2)
    for ax, panel, rows in panels:
        draw_panel(ax, rows, result.settings["delta"], panel)
    legend_below(fig, [ax for ax, _, _ in panels])
    fig.suptitle("Last-iterate heuristic against standard and full-batch analyses")
    save(fig, path)
