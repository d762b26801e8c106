"""Last-iterate paper, Figure 5: the quadratic-regulariser counterexample against the robust
heuristic.

Steinke et al., "The Last Iterate Advantage" (arXiv 2410.06186), Section 4.2 and Figure 5:
DP-SGD on a linear loss with regulariser alpha m^2 / 2 (alpha = 0.5, learning rate 1, one
dimension). For each sample rate q the noise multiplier is set so that one step of DP-SGD is
(1, 1e-6)-DP (panel a) or (2, 1e-6)-DP (panel b); the figure shows, over T, the ratio

    epsilon of the quadratic example / max over t <= T of the heuristic eps_t   (delta = 1e-6).

A ratio above 1 means the example beats even the robust heuristic; the paper finds at most
about 3%. The quadratic epsilon is exact (all 2^T outcomes) for T <= 16 and an upper bound
within 0.1% beyond (:func:`quadratic_regulariser_comparison`, method "auto"; the paper
rounds differently, ``docs/last_iterate.md``, "Known counterexamples").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opacus_lastiterate.analysis.last_iterate.counterexamples import (
    one_step_noise_multiplier,
    quadratic_regulariser_comparison,
)
from opacus_lastiterate.figures._base import Column, FigureResult
from opacus_lastiterate.figures._plotting import legend_below, panel_axes, save, series_style

__all__ = [
    "compute",
    "plot",
]

NAME = "last-iterate-fig5"
"""The figure's name on the command line."""
DELTA = 1e-6
"""The delta of every epsilon (the paper's)."""
ALPHA = 0.5
"""The regulariser coefficient (the paper's)."""
ONE_STEP_EPSILONS = (1.0, 2.0)
"""One step of DP-SGD is (eps1, DELTA)-DP: one panel per eps1 (the paper's)."""
RATES = (0.01, 0.1, 0.5)
"""Sample rates q, one line each."""
STEPS = {
    "quick": (1, 2, 3, 5, 10),
    "default": (1, 2, 3, 4, 6, 8, 12, 16, 20, 30, 50),
    "full": tuple(range(1, 51)),
}
"""The values of T, per size."""


def compute(size: str = "default") -> FigureResult:
    """The ratio for every (one-step epsilon, q, T) of the figure at ``STEPS[size]``."""
    rows: list[dict[str, Any]] = []
    for eps1 in ONE_STEP_EPSILONS:
        for q in RATES:
            sigma = one_step_noise_multiplier(eps1, DELTA, q)
            for t in STEPS[size]:
                c = quadratic_regulariser_comparison(
                    DELTA, steps=t, sample_rate=q, noise_multiplier=sigma, alpha=ALPHA
                )
                rows.append(
                    {
                        "panel": f"one step is ({eps1:g}, {DELTA:g})-DP",
                        "one_step_epsilon": eps1,
                        "sample_rate": q,
                        "noise_multiplier": sigma,
                        "steps": t,
                        "quadratic": c.quadratic.epsilon,
                        "method": c.quadratic.method,
                        "robust_heuristic": c.epsilon_robust,
                        "ratio": c.ratio_to_robust,
                    }
                )
    worst = max(rows, key=lambda r: r["ratio"])
    return FigureResult(
        name=NAME,
        title=(
            f"Last-iterate paper, Figure 5: quadratic regulariser (alpha = {ALPHA:g}) / robust "
            f"heuristic, delta = {DELTA:g}"
        ),
        settings={
            "delta": DELTA,
            "alpha": ALPHA,
            "one_step_epsilons": list(ONE_STEP_EPSILONS),
            "sample_rates": list(RATES),
            "steps": list(STEPS[size]),
            "size": size,
        },
        columns=(
            Column("sample_rate", "q", "g"),
            Column("noise_multiplier", "sigma", ".4f"),
            Column("steps", "T", "d"),
            Column("quadratic", "quadratic", ".4f"),
            Column("robust_heuristic", "max_t eps_t", ".4f"),
            Column("ratio", "ratio", ".4f"),
        ),
        rows=rows,
        labels={
            "quadratic": f"epsilon of linear loss + {ALPHA:g} m^2 / 2 (exact for T <= 16, "
            "else an upper bound within 0.1%)",
            "robust_heuristic": "max over t <= T of the heuristic eps_t (certified upper "
            "bound within 1e-6)",
            "ratio": "quadratic / max_t eps_t: above 1 the example beats the robust heuristic",
        },
        notes=(
            f"largest ratio {worst['ratio']:.4f} at q = {worst['sample_rate']:g}, "
            f"T = {worst['steps']}, {worst['panel']} (the paper: at most about 1.03)",
        ),
        plot=plot,
        group="panel",
    )


def plot(result: FigureResult, path: Path) -> None:
    """One panel per one-step epsilon; one line per sample rate; the ratio over T."""
    fig, panels = panel_axes(result.rows, 5.5, 4.0)
    for ax, panel, rows in panels:
        for i, q in enumerate(dict.fromkeys(r["sample_rate"] for r in rows)):
            sel = [r for r in rows if r["sample_rate"] == q]
            ax.plot([r["steps"] for r in sel], [r["ratio"] for r in sel], "-", ms=4,
                    label=f"sample rate q = {q:g}", **series_style(i + 1))
        ax.axhline(1.0, color="k", lw=0.8, ls=":",
                   label="ratio 1 (above: the example beats the robust heuristic)")
        ax.set_xlabel("number of steps T")
        ax.set_ylabel("epsilon with the quadratic regulariser /\n"
                      "robust heuristic epsilon (ratio, no unit)")
        ax.set_title(panel)
        ax.grid(True, alpha=0.3)
    legend_below(fig, [ax for ax, _, _ in panels])
    fig.suptitle(f"Quadratic regulariser, alpha = {result.settings['alpha']:g}, "
                 f"delta = {result.settings['delta']:g}")
    save(fig, path)
