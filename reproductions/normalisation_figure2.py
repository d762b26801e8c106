"""Reproduce the shape of arXiv 2605.15648, Figure 2: audited delta(0) against N, d = 100.

The paper: Wang, Cui, Cui, Yuan, "Rethinking the Security of DP-SGD: A Corrected Analysis of
Differentially Private Machine Learning" (arXiv 2605.15648); background in
``docs/normalisation.md``.

Panel (a): ASGM (divide by the realised batch size), q = 0.7.
Panel (b): EASGM (divide by the expected batch size q N, q public, N private), q = 0.005.

One step, zero-other-gradients configuration of ``docs/normalisation.md`` ("FEASGM / EASGM
with a data-dependent divisor"), |D| = N and
D' = D + target. For each N the script prints and plots:

* "audited": the likelihood-ratio audit of the simulated 100-dimensional mechanism,
  delta(0) = E_with[(1 - e^(-L))_+] with L the exact log-likelihood ratio of the output
  (an estimate, shown with +/- 4 standard errors; it is the total variation distance);
* "model": the computed curve at epsilon = 0: for ASGM the "batch size revealed" model (the
  d -> infinity limit, an upper bound for d = 100); for EASGM the exact d = 100 curve;
* "SGM": the same q and sigma without normalisation (the curve standard accountants use).

The paper's sigma is not known here; the default sigma = 1 is ours (``--noise-multiplier``).
Expected shape (the paper's Figure 2): delta(0) decreases with N for both mechanisms
and is far above SGM at small N.

    python reproductions/normalisation_figure2.py [--quick] [--no-plot] [--out PATH] [--trials T]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
from _plotting import plotting_available
from dp_accounting.pld import privacy_loss_distribution

from opacus_lastiterate.analysis.normalisation import (
    asgm_pld,
    divisor_leak_pld,
    importance_delta,
    simulate_asgm,
    simulate_divisor_leak,
)

DIMENSION = 100
ASGM_Q = 0.7
EASGM_Q = 0.005
FULL_ASGM_N = [1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 100, 200, 500, 1000]
FULL_EASGM_N = [1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
QUICK_ASGM_N = [1, 2, 4, 8, 20, 50, 200]
QUICK_EASGM_N = [1, 3, 10, 30, 100, 1000, 10000]
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "normalisation_figure2.png"


def sgm_tv(q: float, sigma: float) -> float:
    pld = privacy_loss_distribution.from_gaussian_mechanism(sigma, sampling_prob=q)
    return float(pld.get_delta_for_epsilon(0.0))


def audited(losses: np.ndarray) -> tuple[float, float]:
    est = importance_delta(losses, [0.0], z=4.0)
    return float(est.estimate[0]), float(est.upper[0] - est.estimate[0])


def asgm_row(n: int, sigma: float, trials: int, rng: np.random.Generator) -> dict:
    losses = simulate_asgm(
        rng,
        trials=trials,
        steps=1,
        other_records=n,
        sample_rate=ASGM_Q,
        noise_multiplier=sigma,
        with_target=True,
        dimension=DIMENSION,
    )
    value, half = audited(losses)
    model = asgm_pld(other_records=n, sample_rate=ASGM_Q, noise_multiplier=sigma)
    return dict(n=n, audited=value, half=half, model=float(model.get_delta_for_epsilon(0.0)))


def easgm_row(n: int, sigma: float, trials: int, rng: np.random.Generator) -> dict:
    kw = dict(
        divisor_without=EASGM_Q * n,
        divisor_with=EASGM_Q * (n + 1),
        sample_rate=EASGM_Q,
        noise_multiplier=sigma,
        dimension=DIMENSION,
    )
    losses = simulate_divisor_leak(rng, trials=trials, steps=1, with_target=True, **kw)
    value, half = audited(losses)
    model = divisor_leak_pld(**kw)
    return dict(n=n, audited=value, half=half, model=float(model.get_delta_for_epsilon(0.0)))


def print_table(title: str, rows: list[dict], sgm: float, model_name: str) -> None:
    print(f"\n{title}")
    print(
        f"{'N':>6} | {'audited delta(0)':>22} | {model_name:>22} | {'SGM':>9} | {'audited/SGM':>11}"
    )
    for r in rows:
        print(
            f"{r['n']:>6} | {r['audited']:>11.5f} +/- {r['half']:.5f} | {r['model']:>22.5f} | "
            f"{sgm:>9.5f} | {r['audited'] / sgm:>11.2f}"
        )


def plot(
    path: Path, asgm: list[dict], easgm: list[dict], sgm_a: float, sgm_e: float, sigma: float
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = [
        (axes[0], asgm, sgm_a, f"(a) ASGM, q = {ASGM_Q}", "batch size revealed (d = inf)"),
        (axes[1], easgm, sgm_e, f"(b) EASGM, q = {EASGM_Q}", "exact curve, d = 100"),
    ]
    for ax, rows, sgm, title, model_label in panels:
        n = [r["n"] for r in rows]
        ax.errorbar(
            n,
            [r["audited"] for r in rows],
            yerr=[r["half"] for r in rows],
            fmt="o-",
            capsize=3,
            label="audited, d = 100 (LR test, MC)",
        )
        ax.plot(n, [r["model"] for r in rows], "s--", label=model_label)
        ax.axhline(sgm, color="k", linestyle=":", label="SGM (standard analysis)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of data points N")
        ax.set_ylabel("delta(epsilon = 0)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Audited leakage delta(0), d = {DIMENSION}, sigma = {sigma:g}, one step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer N and trials (< 30 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the plot")
    parser.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib)")
    parser.add_argument("--trials", type=int, default=None, help="Monte Carlo trials per N")
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trials = args.trials or (20_000 if args.quick else 200_000)
    sigma = args.noise_multiplier
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    asgm_n = QUICK_ASGM_N if args.quick else FULL_ASGM_N
    easgm_n = QUICK_EASGM_N if args.quick else FULL_EASGM_N
    asgm = [asgm_row(n, sigma, trials, rng) for n in asgm_n]
    easgm = [easgm_row(n, sigma, trials, rng) for n in easgm_n]
    sgm_a, sgm_e = sgm_tv(ASGM_Q, sigma), sgm_tv(EASGM_Q, sigma)
    print(f"Figure 2 shape: d = {DIMENSION}, sigma = {sigma:g}, {trials} trials per N, epsilon = 0")
    print_table(f"(a) ASGM, q = {ASGM_Q}", asgm, sgm_a, "batch-size-revealed")
    print_table(f"(b) EASGM, q = {EASGM_Q} (divisor q N)", easgm, sgm_e, "exact d=100 curve")
    decreasing = all(
        rows[i]["model"] >= rows[i + 1]["model"] - 1e-12
        for rows in (asgm, easgm)
        for i in range(len(rows) - 1)
    )
    print(f"\nmodel delta(0) decreasing in N: {decreasing}")
    if plotting_available(args.no_plot):
        plot(args.out, asgm, easgm, sgm_a, sgm_e, sigma)
        print(f"plot saved to {args.out}  ({time.perf_counter() - start:.1f} s)")
    if not math.isfinite(sgm_a):  # pragma: no cover - defensive
        raise SystemExit(1)


if __name__ == "__main__":
    main()
