"""Last-iterate paper, Figure 3: Dirac gradient canary with an adversarial data set.

Steinke et al., "The Last Iterate Advantage" (arXiv 2410.06186), Section 3, "Gradient Space
Attack", adversarial data set: the canary's clipped gradient is C on one coordinate, every
other record has zero gradient, the canary is Poisson-sampled at rate q, only theta_T is
released and the score is theta_0[c] - theta_T[c]. For each (q, T) the noise multiplier is
set so that the standard (all-iterates) analysis gives ``target_epsilon`` at delta = 1e-5
(calibrated on a coarse PLD grid, 1e-2, which errs towards more noise), and ``trials`` runs
per side are simulated with :func:`~opacus_lastiterate.auditing.simulate_adversarial_dataset`.
Per row:

* bound: Clopper-Pearson lower bound (95%, Bonferroni over a rank grid): a valid bound;
* GDP est.: the Gaussian-DP conversion: an ESTIMATE (assumes a Gaussian trade-off);
* heuristic: the last-iterate heuristic epsilon (exact for this linear setting);
* standard: the composition bound (dp_accounting PLD; interval 1e-4, 1e-3 when quick).

Expected shape: the bound tracks the heuristic except at small T, stays below it (up to the
5% failure rate of the bound), and both sit below the standard epsilon. The paper uses
100,000 trials per side ("full") and does not state its target epsilon; 4 is ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.baselines.composition import (
    DEFAULT_DISCRETIZATION,
    standard_epsilon,
)
from opacus_lastiterate.analysis.calibration import calibrate_noise_multiplier
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.figures._base import Column, FigureResult
from opacus_lastiterate.figures._plotting import (
    OKABE_ITO,
    legend_below,
    panel_axes,
    quick_note,
    save,
)

__all__ = [
    "compute",
    "plot",
]

NAME = "last-iterate-fig3"
"""The figure's name on the command line."""
DELTA = 1e-5
"""The delta of every epsilon."""
STEPS = {
    "quick": {0.1: (1, 10, 100), 0.01: (10, 100)},
    "default": {0.1: (1, 10, 100, 1000), 0.01: (100, 1000)},
    "full": {0.1: (1, 2, 5, 10, 30, 100, 300, 1000), 0.01: (10, 30, 100, 300, 1000, 3000, 10000)},
}
"""Sample rate q -> the values of T, per size."""
TRIALS = {"quick": 4_000, "default": 20_000, "full": 100_000}
"""Simulated runs per side, per size."""
_INTERVAL = {"quick": 1e-3, "default": DEFAULT_DISCRETIZATION, "full": DEFAULT_DISCRETIZATION}


def compute(
    size: str = "default",
    *,
    trials: int | None = None,
    target_epsilon: float = 4.0,
    seed: int = 0,
) -> FigureResult:
    """Simulate and audit every (q, T) of ``STEPS[size]`` with ``trials`` runs per side."""
    from opacus_lastiterate.auditing import (
        AdversarialDataset,
        DPSGDArithmetic,
        PoissonInsertion,
        audit_scores,
        simulate_adversarial_dataset,
    )

    n = TRIALS[size] if trials is None else trials
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for q, steps_list in STEPS[size].items():
        attack = AdversarialDataset(PoissonInsertion(q))
        for steps in steps_list:
            sigma = calibrate_noise_multiplier(
                target_epsilon, DELTA, steps=steps, sample_rate=q, accountant="standard",
                value_discretization_interval=1e-2, rtol=1e-3,
            )
            arith = DPSGDArithmetic(sigma)
            kw: dict[str, Any] = {"steps": steps, "trials": n, "rng": rng}
            ins = simulate_adversarial_dataset(attack, arith, canary_in=True, **kw)
            outs = simulate_adversarial_dataset(attack, arith, canary_in=False, **kw)
            audit = audit_scores(ins, outs, delta=DELTA)
            model: dict[str, Any] = {"steps": steps, "sample_rate": q, "noise_multiplier": sigma}
            rows.append(
                {
                    "panel": f"q = {q:g}",
                    **model,
                    "bound": audit.bound.epsilon,
                    "estimate": audit.estimate.epsilon,
                    "heuristic": privacy_model(
                        "heuristic", DPSGDRun.constant(**model)
                    ).epsilon(DELTA),
                    "standard": standard_epsilon(
                        DELTA, value_discretization_interval=_INTERVAL[size], **model
                    ),
                }
            )
    return FigureResult(
        name=NAME,
        title=(
            f"Last-iterate paper, Figure 3: adversarial data set, Dirac canary, delta = "
            f"{DELTA:g}, {n} trials per side, standard epsilon set to {target_epsilon:g}"
        ),
        settings={
            "delta": DELTA,
            "trials": n,
            "target_epsilon": target_epsilon,
            "seed": seed,
            "value_discretization_interval": _INTERVAL[size],
            "steps": {str(q): list(t) for q, t in STEPS[size].items()},
            "size": size,
        },
        columns=(
            Column("steps", "T", "d"),
            Column("noise_multiplier", "sigma", ".4f"),
            Column("bound", "bound", ".3f"),
            Column("estimate", "GDP est.", ".3f"),
            Column("heuristic", "heuristic", ".3f"),
            Column("standard", "standard", ".3f"),
        ),
        rows=rows,
        labels={
            "bound": "Clopper-Pearson 95% lower bound (valid)",
            "estimate": "Gaussian-DP estimate (assumes a Gaussian trade-off), not a bound",
            "heuristic": "last-iterate heuristic (exact here: linear loss)",
            "standard": "standard composition (all iterates): dp_accounting PLD with interval "
            f"{_INTERVAL[size]:g}, an upper bound",
        },
        plot=plot,
        group="panel",
    )


def plot(result: FigureResult, path: Path) -> None:
    """One panel per q: standard, heuristic, the audit's bound and estimate over T."""
    fig, panels = panel_axes(result.rows, 5.5, 4.0)
    for ax, panel, sel in panels:
        t = [r["steps"] for r in sel]
        ax.plot(t, [r["standard"] for r in sel], "-", color=OKABE_ITO[0], marker="s",
                label="standard (all iterates): upper bound")
        ax.plot(t, [r["heuristic"] for r in sel], "-", color=OKABE_ITO[5], marker="o",
                label="last-iterate heuristic")
        ax.plot(t, [r["bound"] for r in sel], "-", color=OKABE_ITO[4], marker="D",
                label="audit: Clopper-Pearson lower bound (95%)")
        ax.plot(t, [r["estimate"] for r in sel], "--", color=OKABE_ITO[1], marker="^",
                label="audit: Gaussian-DP estimate (not a bound)")
        ax.set_xscale("log")
        ax.set_xlabel("number of steps T (log scale)")
        ax.set_ylabel(f"epsilon at delta = {result.settings['delta']:g} (no unit)")
        ax.set_title(f"{panel}, {result.settings['trials']} trials per side")
        ax.grid(True, alpha=0.3)
    fig.suptitle("Auditing the final model (adversarial data set) against the heuristic and "
                 "the standard epsilon")
    legend_below(fig, [ax for ax, _, _ in panels])
    quick_note(fig, result.settings)
    save(fig, path)
