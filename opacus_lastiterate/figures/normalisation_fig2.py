"""Normalisation paper, Figure 2: audited delta(0) against the data set size N, d = 100.

Wang, Cui, Cui, Yuan, "Rethinking the Security of DP-SGD: A Corrected Analysis of
Differentially Private Machine Learning" (arXiv 2605.15648), Figure 2; background in
``docs/normalisation.md``. Panel (a): ASGM (divide by the realised batch size), q = 0.7.
Panel (b): EASGM (divide by the expected batch size q N, q public, N private), q = 0.005.

One step, the zero-other-gradients configuration of ``docs/normalisation.md`` ("FEASGM /
EASGM with a data-dependent divisor"), ``|D| = N`` and D' = D + target. For each N:

* audited: the likelihood-ratio audit of the simulated 100-dimensional mechanism,
  delta(0) = E_with[(1 - e^(-L))_+] with L the exact log-likelihood ratio (an ESTIMATE with
  +/- 4 standard errors; delta(0) is the total variation distance);
* model: the computed curve at epsilon = 0: for ASGM the "batch size revealed" model (the
  d -> infinity limit, an upper bound for d = 100); for EASGM the exact d = 100 curve;
* SGM: the same q and sigma without normalisation (what standard accountants assume).

The paper's sigma is not known here; sigma = 1 is ours. Expected shape: delta(0) falls with
N for both mechanisms and is far above SGM at small N.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np

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

NAME = "normalisation-fig2"
"""The figure's name on the command line."""
DIMENSION = 100
"""d, the number of coordinates of the simulated mechanism."""
ASGM_Q = 0.7
"""Sample rate of panel (a), ASGM."""
EASGM_Q = 0.005
"""Sample rate of panel (b), EASGM."""
SIZES = {
    "quick": ((1, 4, 20, 200), (1, 10, 100, 10000)),
    "default": ((1, 2, 4, 8, 20, 50, 200), (1, 3, 10, 30, 100, 1000, 10000)),
    "full": (
        (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100, 200, 500, 1000),
        (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
    ),
}
"""(ASGM data set sizes, EASGM data set sizes), per size."""
TRIALS = {"quick": 4_000, "default": 20_000, "full": 200_000}
"""Monte Carlo runs per N, per size."""


def _audited(losses: np.ndarray) -> tuple[float, float]:
    from opacus_lastiterate.analysis.normalisation.empirical import importance_delta

    est = importance_delta(losses, [0.0], z=4.0)
    return float(est.estimate[0]), float(est.upper[0] - est.estimate[0])


def _sgm_delta0(q: float, sigma: float) -> float:
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(sigma, sampling_prob=q)
    return float(pld.get_delta_for_epsilon(0.0))


def compute(
    size: str = "default",
    *,
    trials: int | None = None,
    noise_multiplier: float = 1.0,
    seed: int = 0,
) -> FigureResult:
    """Audited and computed delta(0) for every N of ``SIZES[size]``."""
    from opacus_lastiterate.analysis._validation import check_noise_multiplier
    from opacus_lastiterate.analysis.normalisation.asgm import asgm_pld
    from opacus_lastiterate.analysis.normalisation.divisor_leak import divisor_leak_pld
    from opacus_lastiterate.analysis.normalisation.simulation import (
        simulate_asgm,
        simulate_divisor_leak,
    )

    sigma = check_noise_multiplier(noise_multiplier)
    n_trials = TRIALS[size] if trials is None else trials
    rng = np.random.default_rng(seed)
    asgm_sizes, easgm_sizes = SIZES[size]
    sgm = {"ASGM": _sgm_delta0(ASGM_Q, sigma), "EASGM": _sgm_delta0(EASGM_Q, sigma)}
    rows: list[tuple[str, float, int, Any, float]] = []
    for n in asgm_sizes:
        losses = simulate_asgm(
            rng, trials=n_trials, steps=1, other_records=n, sample_rate=ASGM_Q,
            noise_multiplier=sigma, with_target=True, dimension=DIMENSION,
        )
        model = asgm_pld(other_records=n, sample_rate=ASGM_Q, noise_multiplier=sigma)
        rows.append(("ASGM", ASGM_Q, n, losses, float(model.get_delta_for_epsilon(0.0))))
    for n in easgm_sizes:
        kw: dict[str, Any] = dict(
            divisor_without=EASGM_Q * n, divisor_with=EASGM_Q * (n + 1), sample_rate=EASGM_Q,
            noise_multiplier=sigma, dimension=DIMENSION,
        )
        losses = simulate_divisor_leak(rng, trials=n_trials, steps=1, with_target=True, **kw)
        rows.append(("EASGM", EASGM_Q, n, losses, float(divisor_leak_pld(**kw).get_delta_for_epsilon(0.0))))
    table: list[dict[str, Any]] = []
    for mechanism, q, n, losses, model_value in rows:
        value, half = _audited(losses)
        table.append(
            {
                "panel": f"({'a' if mechanism == 'ASGM' else 'b'}) {mechanism}, q = {q:g}",
                "mechanism": mechanism,
                "sample_rate": q,
                "dataset_size": n,
                "audited": value,
                "audited_half_width": half,
                "model": model_value,
                "sgm": sgm[mechanism],
                "audited_over_sgm": value / sgm[mechanism],
            }
        )
    decreasing = all(
        a["model"] >= b["model"] - 1e-12
        for a, b in itertools.pairwise(table)
        if a["mechanism"] == b["mechanism"]
    )
    return FigureResult(
        name=NAME,
        title=(
            f"Normalisation paper, Figure 2: delta(0) against N, d = {DIMENSION}, "
            f"sigma = {sigma:g}, one step, {n_trials} trials per N"
        ),
        settings={
            "dimension": DIMENSION,
            "noise_multiplier": sigma,
            "trials": n_trials,
            "seed": seed,
            "asgm_sample_rate": ASGM_Q,
            "easgm_sample_rate": EASGM_Q,
            "size": size,
            "model_decreasing_in_n": decreasing,
        },
        columns=(
            Column("dataset_size", "N", "d"),
            Column("audited", "audited delta(0)", ".5f"),
            Column("audited_half_width", "+/-", ".5f"),
            Column("model", "model", ".5f"),
            Column("sgm", "SGM", ".5f"),
            Column("audited_over_sgm", "audited/SGM", ".2f"),
        ),
        rows=table,
        labels={
            "audited": "likelihood-ratio audit of the simulated mechanism (an estimate, "
            "+/- 4 standard errors)",
            "model": "ASGM: batch size revealed (d -> inf, an upper bound); EASGM: exact "
            f"d = {DIMENSION} curve",
            "sgm": "the same q and sigma without normalisation",
        },
        notes=(f"model delta(0) decreasing in N: {decreasing}",),
        plot=plot,
        group="panel",
    )


def plot(result: FigureResult, path: Path) -> None:
    """One log-log panel per mechanism: audited (with error bars), model and SGM."""
    fig, panels = panel_axes(result.rows, 11.0 / len({r["panel"] for r in result.rows}), 4.2)
    d = result.settings["dimension"]
    for ax, panel, rows in panels:
        n = [r["dataset_size"] for r in rows]
        ax.errorbar(n, [r["audited"] for r in rows], yerr=[r["audited_half_width"] for r in rows],
                    fmt="o-", color=OKABE_ITO[5], capsize=3,
                    label=f"audited, d = {d} (LR test, Monte Carlo; bars: 4 standard errors)")
        model_label = ("batch size revealed (d = inf)" if rows[0]["mechanism"] == "ASGM"
                       else f"exact curve, d = {d}")
        ax.plot(n, [r["model"] for r in rows], "s--", color=OKABE_ITO[4], label=model_label)
        ax.axhline(rows[0]["sgm"], color=OKABE_ITO[0], linestyle=":",
                   label="SGM (standard analysis)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of data points N (log scale)")
        ax.set_ylabel("delta at epsilon = 0 (probability, log scale)")
        ax.set_title(panel)
        ax.grid(True, which="both", alpha=0.3)
    legend_below(fig, [ax for ax, _, _ in panels], ncol=2)
    quick_note(fig, result.settings)
    fig.suptitle(f"Audited leakage delta(0), d = {d}, "
                 f"sigma = {result.settings['noise_multiplier']:g}, one step")
    save(fig, path)
