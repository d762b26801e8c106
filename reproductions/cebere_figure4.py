"""Cebere et al., Figure 4: A_S^{h*}, canary at step 1 only, T = 25: eps_25 / eps_1.

The adversary crafts the gradient (C at step 1) and a threshold loss landscape that keeps
the first step's decision (:class:`WorstCaseLandscape`, sign discussed there); N trials per
side of :func:`simulate_worst_case_landscape`; the audit at step t uses theta_t as score.
Printed per (sigma, B): the EXACT eps_1, eps_25 and ratio of the simulated process (density
evolution on a grid, :mod:`opacus_lastiterate.auditing.exact`, with its discretisation
error), then eps_25 and the ratio for the Gaussian-DP ESTIMATE (the paper's GDP auditing;
assumes a Gaussian trade-off; the step-25 law is bimodal, so it overstates) and for the
Clopper-Pearson lower BOUND (95%; never above exact, up to its 5% failure rate). Expected
shape: ratio near 1 for B = 16 (no amplification), well below 1 for small B. delta = 1e-5.

    python reproductions/cebere_figure4.py [--quick] [--no-plot] [--out DIR] [--trials N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _plotting import plotting_available

from opacus_lastiterate.auditing import (
    WorstCaseLandscape,
    audit_scores,
    simulate_worst_case_landscape,
)
from opacus_lastiterate.auditing.exact import worst_case_landscape_epsilons

DELTA = 1e-5
STEPS = 25
BATCHES = [1, 2, 4, 8, 16]
SIGMAS = [1.0, 2.0, 4.0, 8.0]
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "cebere_figure4"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 trials per side (< 60 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib)")
    parser.add_argument("--trials", type=int, default=None, help="trials per side")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trials = args.trials or (20_000 if args.quick else 100_000)
    grid = 0.02 if args.quick else 0.01
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    ratios = {k: np.zeros((len(SIGMAS), len(BATCHES))) for k in ("exact", "gdp", "cp")}
    curves = {}
    print(f"Cebere et al. Figure 4 (A_S^h*), T = {STEPS}, delta = {DELTA:g}, {trials} trials per "
          f"side; exact by density evolution (grid {grid / 2:g})")
    print(f"{'sigma':>5} {'B':>3} | {'exact e1':>8} {'e25':>6} {'ratio':>6} {'err':>7} | "
          f"{'GDP e25':>7} {'ratio':>6} {'/exact':>6} | {'CP e1':>6} {'e25':>6} {'ratio':>6}")
    worst_err = 0.0
    for i, sigma in enumerate(SIGMAS):
        for j, b in enumerate(BATCHES):
            attack = WorstCaseLandscape(batch_size=b)
            exact = worst_case_landscape_epsilons(
                attack, noise_multiplier=sigma, steps=STEPS, delta=DELTA, grid_step=grid
            )
            e = exact.epsilons
            worst_err = max(worst_err, float(exact.error.max()))
            kw = {"noise_multiplier": sigma, "steps": STEPS, "trials": trials, "rng": rng}
            ins = simulate_worst_case_landscape(attack, canary_in=True, **kw)
            outs = simulate_worst_case_landscape(attack, canary_in=False, **kw)
            first, last = (audit_scores(ins[:, t], outs[:, t], delta=DELTA) for t in (0, STEPS - 1))
            g = [first.estimate.epsilon, last.estimate.epsilon]
            c = [first.bound.epsilon, last.bound.epsilon]
            curves[(sigma, b)] = e
            ratios["exact"][i, j] = e[-1] / e[0]
            ratios["gdp"][i, j] = g[1] / g[0] if g[0] > 0 else np.nan
            ratios["cp"][i, j] = c[1] / c[0] if c[0] > 0 else np.nan
            print(f"{sigma:>5g} {b:>3d} | {e[0]:>8.3f} {e[-1]:>6.3f} {ratios['exact'][i, j]:>6.3f} "
                  f"{exact.error[-1]:>7.1e} | {g[1]:>7.3f} {ratios['gdp'][i, j]:>6.3f} "
                  f"{g[1] / e[-1]:>6.2f} | {c[0]:>6.3f} {c[1]:>6.3f} {ratios['cp'][i, j]:>6.3f}")
    print("exact = epsilon of the simulated process (err = |grid - grid/2| at t = 25, largest "
          f"{worst_err:.1e}); GDP = estimate (assumes a Gaussian trade-off), /exact = its "
          "overstatement at t = 25; CP = Clopper-Pearson 95% lower bound.")
    print(f"elapsed {time.perf_counter() - start:.1f} s")
    if plotting_available(args.no_plot):
        save_plot(ratios, curves, args.out)


def save_plot(ratios, curves, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for sigma in (SIGMAS[0], SIGMAS[-1]):
        for bs in BATCHES:
            a.plot(range(1, STEPS + 1), curves[(sigma, bs)], label=f"sigma={sigma:g}, B={bs}")
    a.set_xlabel("step t")
    a.set_ylabel("exact eps_t (delta = 1e-5)")
    a.legend(fontsize=6, ncol=2)
    styles = {"exact": ("k", "exact"), "gdp": ("r", "GDP estimate"), "cp": ("b", "CP bound")}
    for i, sigma in enumerate(SIGMAS):
        for key, (colour, label) in styles.items():
            b.plot(BATCHES, ratios[key][i], colour, marker="o", alpha=0.3 + 0.7 * i / len(SIGMAS),
                   label=label if i == 0 else None)
    b.set_xscale("log", base=2)
    b.set_xlabel("batch size B")
    b.set_ylabel("eps_25 / eps_1")
    b.set_title("exact vs GDP estimate vs CP bound (darker = larger sigma)", fontsize=9)
    b.legend(fontsize=8)
    fig.tight_layout()
    path = out / "cebere_figure4.png"
    fig.savefig(path, dpi=120)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
