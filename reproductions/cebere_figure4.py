"""Cebere et al., Figure 4: A_S^{h*}, canary at step 1 only, T = 25: eps_25 / eps_1.

The adversary crafts the gradient (C at step 1) and a threshold loss landscape that keeps
the first step's decision (:class:`WorstCaseLandscape`, sign discussed there); N trials per
side of :func:`simulate_worst_case_landscape`; the audit at step t uses theta_t as score.
Printed per (sigma, B): eps_1, eps_25 and their ratio for the Gaussian-DP ESTIMATE (the
paper's GDP auditing; assumes a Gaussian trade-off) and for the Clopper-Pearson lower
BOUND (95%). Expected shape: ratio near 1 for B = 16 (no amplification), well below 1 for
small B and large sigma. delta = 1e-5.

    python reproductions/cebere_figure4.py [--quick] [--out DIR] [--trials N]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from opacus_lastiterate.auditing import (
    WorstCaseLandscape,
    audit_scores,
    simulate_worst_case_landscape,
)

DELTA = 1e-5
STEPS = 25
BATCHES = [1, 2, 4, 8, 16]
SIGMAS = [1.0, 2.0, 4.0, 8.0]
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "cebere_figure4"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 trials per side (< 60 s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--trials", type=int, default=None, help="trials per side")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    trials = args.trials or (20_000 if args.quick else 100_000)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    ratio_gdp = np.zeros((len(SIGMAS), len(BATCHES)))
    curves = {}
    print(f"Cebere et al. Figure 4 (A_S^h*), T = {STEPS}, delta = {DELTA:g}, {trials} trials per side")
    print(f"{'sigma':>5} {'B':>3} | {'GDP eps_1':>9} {'eps_25':>7} {'ratio':>6} | {'CP eps_1':>8} {'eps_25':>7} {'ratio':>6}")
    for i, sigma in enumerate(SIGMAS):
        for j, b in enumerate(BATCHES):
            attack = WorstCaseLandscape(batch_size=b)
            kw = {"noise_multiplier": sigma, "steps": STEPS, "trials": trials, "rng": rng}
            ins = simulate_worst_case_landscape(attack, canary_in=True, **kw)
            outs = simulate_worst_case_landscape(attack, canary_in=False, **kw)
            per_step = [audit_scores(ins[:, t], outs[:, t], delta=DELTA) for t in range(STEPS)]
            g = [a.estimate.epsilon for a in per_step]
            c = [a.bound.epsilon for a in per_step]
            curves[(sigma, b)] = (g, c)
            ratio_gdp[i, j] = g[-1] / g[0] if g[0] > 0 else np.nan
            rc = c[-1] / c[0] if c[0] > 0 else float("nan")
            print(f"{sigma:>5g} {b:>3d} | {g[0]:>9.3f} {g[-1]:>7.3f} {ratio_gdp[i, j]:>6.3f} | "
                  f"{c[0]:>8.3f} {c[-1]:>7.3f} {rc:>6.3f}")
    print("GDP = estimate (assumes a Gaussian trade-off; the step-25 law is bimodal, so it can "
          "overstate); CP = Clopper-Pearson 95% lower bound.")
    print(f"elapsed {time.perf_counter() - start:.1f} s")
    save_plot(ratio_gdp, curves, args.out)


def save_plot(ratio, curves, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for sigma in (SIGMAS[0], SIGMAS[-1]):
        for bs in BATCHES:
            g, _ = curves[(sigma, bs)]
            a.plot(range(1, STEPS + 1), g, label=f"sigma={sigma:g}, B={bs}")
    a.set_xlabel("step t")
    a.set_ylabel("GDP estimate of eps_t (delta = 1e-5)")
    a.legend(fontsize=6, ncol=2)
    im = b.imshow(ratio, vmin=0, vmax=1, cmap="viridis", origin="lower")
    b.set_xticks(range(len(BATCHES)), [str(x) for x in BATCHES])
    b.set_yticks(range(len(SIGMAS)), [f"{s:g}" for s in SIGMAS])
    b.set_xlabel("batch size B")
    b.set_ylabel("sigma")
    for i in range(ratio.shape[0]):
        for j in range(ratio.shape[1]):
            b.text(j, i, f"{ratio[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=b, label="eps_25 / eps_1 (GDP estimate)")
    fig.tight_layout()
    path = out / "cebere_figure4.png"
    fig.savefig(path, dpi=120)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
