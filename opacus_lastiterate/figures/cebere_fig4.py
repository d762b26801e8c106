"""Hidden-state auditing paper, Figure 4: a canary inserted once, audited after 25 steps.

Cebere, Bellet, Papernot, "Tighter Privacy Auditing of DP-SGD in the Hidden State Threat
Model" (arXiv 2405.14457), Figure 4: adversary A_S^{h*} crafts the gradient (C at step 1
only) and a threshold loss landscape that keeps the first step's decision
(:class:`~opacus_lastiterate.auditing.WorstCaseLandscape`); the audit at step t scores
theta_t. The figure shows eps_25 / eps_1 against the batch size B for several sigma. Per
(sigma, B) we print:

* exact: eps_1, eps_25 and their ratio for the simulated process (density evolution on a
  grid, :mod:`opacus_lastiterate.auditing.gradient_space.exact`, with its discretisation error);
* GDP: eps_25 and the ratio of the Gaussian-DP ESTIMATE from ``trials`` simulated runs per
  side (the paper's auditing; it assumes a Gaussian trade-off, and the step-25 law is
  bimodal, so it overstates);
* CP: the Clopper-Pearson lower BOUND (95%) from the same runs (never above exact, up to
  its 5% failure rate).

Expected shape: ratio near 1 for B = 16 (no amplification), well below 1 for small B.
delta = 1e-5.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from opacus_lastiterate.figures._base import Column, FigureResult
from opacus_lastiterate.figures._plotting import (
    OKABE_ITO,
    pyplot,
    quick_note,
    save,
    series_style,
)

__all__ = [
    "compute",
    "plot",
]

NAME = "cebere-fig4"
"""The figure's name on the command line."""
DELTA = 1e-5
"""The delta of every epsilon."""
STEPS = 25
"""The step t audited last (the canary is inserted at step 1 only)."""
BATCHES = {"quick": (1, 4, 16), "default": (1, 2, 4, 8, 16), "full": (1, 2, 4, 8, 16)}
"""Batch sizes B, per size."""
SIGMAS = {"quick": (1.0, 4.0), "default": (1.0, 2.0, 4.0, 8.0), "full": (1.0, 2.0, 4.0, 8.0)}
"""Noise multipliers, per size."""
TRIALS = {"quick": 4_000, "default": 20_000, "full": 100_000}
GRID = {"quick": 0.05, "default": 0.02, "full": 0.01}
"""Cell width of the density evolution (in units of C), per size."""


def _ratio(last: float, first: float) -> float:
    return last / first if first > 0 else float("nan")


def compute(size: str = "default", *, trials: int | None = None, seed: int = 0) -> FigureResult:
    """Exact, estimated and bounded eps_1 and eps_25 for every (sigma, B) of the size."""
    from opacus_lastiterate.auditing import audit_scores
    from opacus_lastiterate.auditing.gradient_space.adversaries import WorstCaseLandscape
    from opacus_lastiterate.auditing.gradient_space.exact import worst_case_landscape_epsilons
    from opacus_lastiterate.auditing.gradient_space.simulator import simulate_worst_case_landscape

    n = TRIALS[size] if trials is None else trials
    grid = GRID[size]
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for sigma in SIGMAS[size]:
        for b in BATCHES[size]:
            attack = WorstCaseLandscape(batch_size=b)
            exact = worst_case_landscape_epsilons(
                attack, noise_multiplier=sigma, steps=STEPS, delta=DELTA, grid_step=grid
            )
            e = exact.epsilons
            kw: dict[str, Any] = {"noise_multiplier": sigma, "steps": STEPS, "trials": n, "rng": rng}
            ins = simulate_worst_case_landscape(attack, canary_in=True, **kw)
            outs = simulate_worst_case_landscape(attack, canary_in=False, **kw)
            first, last = (audit_scores(ins[:, t], outs[:, t], delta=DELTA) for t in (0, STEPS - 1))
            rows.append(
                {
                    "noise_multiplier": sigma,
                    "batch_size": b,
                    "exact_first": float(e[0]),
                    "exact_last": float(e[-1]),
                    "exact_ratio": _ratio(float(e[-1]), float(e[0])),
                    "exact_error": float(exact.error[-1]),
                    "exact_curve": [float(x) for x in e],
                    "gdp_last": last.estimate.epsilon,
                    "gdp_ratio": _ratio(last.estimate.epsilon, first.estimate.epsilon),
                    "cp_first": first.bound.epsilon,
                    "cp_last": last.bound.epsilon,
                    "cp_ratio": _ratio(last.bound.epsilon, first.bound.epsilon),
                }
            )
    worst = max(r["exact_error"] for r in rows)
    return FigureResult(
        name=NAME,
        title=(
            f"Hidden-state auditing paper, Figure 4 (A_S^h*): T = {STEPS}, delta = {DELTA:g}, "
            f"{n} trials per side, exact by density evolution (grid {grid / 2:g} C)"
        ),
        settings={
            "delta": DELTA,
            "steps": STEPS,
            "trials": n,
            "grid_step": grid,
            "seed": seed,
            "noise_multipliers": list(SIGMAS[size]),
            "batch_sizes": list(BATCHES[size]),
            "size": size,
        },
        columns=(
            Column("noise_multiplier", "sigma", "g"),
            Column("batch_size", "B", "d"),
            Column("exact_first", "exact e1", ".3f"),
            Column("exact_last", "e25", ".3f"),
            Column("exact_ratio", "ratio", ".3f"),
            Column("exact_error", "err", ".1e"),
            Column("gdp_last", "GDP e25", ".3f"),
            Column("gdp_ratio", "ratio", ".3f"),
            Column("cp_first", "CP e1", ".3f"),
            Column("cp_last", "e25", ".3f"),
            Column("cp_ratio", "ratio", ".3f"),
        ),
        rows=rows,
        labels={
            "exact": "epsilon of the simulated process (err: change when the grid is halved, "
            f"largest {worst:.1e})",
            "gdp": "Gaussian-DP estimate (assumes a Gaussian trade-off), not a bound",
            "cp": "Clopper-Pearson 95% lower bound",
        },
        plot=plot,
    )


def plot(result: FigureResult, path: Path) -> None:
    """Left: exact eps_t over t for the smallest sigma, one line per B. Right: eps_25 / eps_1
    against B (exact, GDP estimate, CP bound), darker for larger sigma."""
    plt = pyplot()
    rows = result.rows
    sigmas = list(dict.fromkeys(r["noise_multiplier"] for r in rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, r in enumerate(r for r in rows if r["noise_multiplier"] == sigmas[0]):
        curve = r["exact_curve"]
        steps = range(1, len(curve) + 1)
        left.plot(steps, curve, "-", markevery=max(1, len(curve) // 8), ms=5,
                  label=f"B = {r['batch_size']}", **series_style(i))
    left.set_xlabel("step t")
    left.set_ylabel(f"exact eps_t at delta = {result.settings['delta']:g} (no unit)")
    left.set_title(f"exact epsilon of theta_t, sigma = {sigmas[0]:g}")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8, title="batch size", title_fontsize=8, loc="upper left",
                bbox_to_anchor=(1.01, 1.0), frameon=False)
    # colour = sigma (one colour each), line style and marker = the kind of number
    kinds = {"exact": ("-", "o", "exact"), "gdp": ("--", "^", "Gaussian-DP estimate"),
             "cp": (":", "s", "Clopper-Pearson lower bound")}
    for i, sigma in enumerate(sigmas):
        sel = [r for r in rows if r["noise_multiplier"] == sigma]
        for key, (line, marker, _) in kinds.items():
            right.plot([r["batch_size"] for r in sel], [r[f"{key}_ratio"] for r in sel],
                       line, color=OKABE_ITO[(i + 1) % len(OKABE_ITO)], marker=marker, ms=5)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=OKABE_ITO[(i + 1) % len(OKABE_ITO)], lw=3,
                      label=f"sigma = {s:g}") for i, s in enumerate(sigmas)]
    handles += [Line2D([], [], color="0.3", ls=line, marker=marker, label=label)
                for line, marker, label in kinds.values()]
    right.set_xscale("log", base=2)
    right.set_xlabel("batch size B (examples, log scale)")
    right.set_ylabel(f"eps_{result.settings['steps']} / eps_1 (ratio, no unit)")
    right.set_title("privacy of the last iterate relative to step 1")
    right.grid(True, alpha=0.3)
    right.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                 frameon=False)
    fig.suptitle("Hidden-state DP-SGD (Cebere et al., Figure 4): epsilon of the last iterate")
    quick_note(fig, result.settings)
    save(fig, path)
