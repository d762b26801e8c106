"""Monte Carlo validation of the normalisation curves (issue 3), at full settings.

For each configuration the exact mechanism is simulated (vectorised, seeded), the
likelihood-ratio test is audited, and three delta(eps) columns are printed per direction:

* ``computed``: the curve of :mod:`opacus_lastiterate.analysis.normalisation` (an upper bound);
* ``audit lower``: the lower end of a simultaneous Clopper-Pearson band (level 0.999) of the
  threshold test: it must never exceed ``computed``;
* ``MC estimate``: E[(1 - e^(eps - L))_+] with its 4-standard-error half width: for these exact
  models it should agree with ``computed``.

    python reproductions/normalisation_monte_carlo.py [--quick] [--no-plot] [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from _plotting import plotting_available

from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.analysis.normalisation import (
    asgm_pld,
    divisor_leak_pld,
    importance_delta,
    simulate_asgm,
    simulate_divisor_leak,
    threshold_delta,
)

EPS = np.array([0.0, 0.5, 1.0, 2.0, 3.0])
DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "normalisation_monte_carlo"


def configurations(quick: bool):
    asgm = [(4, 1), (8, 10), (20, 25), (20_000, 10)]
    for n, steps in asgm[:2] if quick else asgm:
        kw = dict(steps=steps, other_records=n, sample_rate=0.1, noise_multiplier=1.0)
        yield (
            f"ASGM N={n} T={steps} q=0.1 sigma=1",
            lambda rng, trials, target, kw=kw: simulate_asgm(rng, trials=trials, with_target=target, **kw),
            asgm_pld(**kw),
            standard_epsilon(1e-5, steps=steps, sample_rate=0.1, noise_multiplier=1.0),
        )
    leak = dict(divisor_without=255.0, divisor_with=256.0, sample_rate=1 / 235,
                noise_multiplier=1.0, dimension=100_000, steps=1 if quick else 20)
    yield (
        f"FEASGM c=255/256 d=1e5 T={leak['steps']}",
        lambda rng, trials, target: simulate_divisor_leak(rng, trials=trials, with_target=target, **leak),
        divisor_leak_pld(**leak),
        standard_epsilon(1e-5, steps=leak["steps"], sample_rate=1 / 235, noise_multiplier=1.0),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer configurations and trials")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--no-plot", action="store_true", help="print the table only (no matplotlib)")
    parser.add_argument("--trials", type=int, default=None, help="trials per side")
    args = parser.parse_args()
    trials = args.trials or (100_000 if args.quick else 1_000_000)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    rows, violations = [], 0
    for name, simulate, pld, sgm in configurations(args.quick):
        with_l, without_l = simulate(rng, trials, True), simulate(rng, trials, False)
        print(f"\n{name}: {trials} trials per side; SGM epsilon at delta=1e-5: {sgm:.4f}")
        print(f"  {'direction':<9} {'eps':>5} {'computed':>11} {'audit lower':>12} {'MC estimate':>12} {'+-':>9}")
        for direction, pmf, up, low in (
            ("remove", pld._pmf_remove, with_l, without_l),
            ("add", pld._pmf_add, -without_l, -with_l),
        ):
            computed = np.asarray(pmf.get_delta_for_epsilon(EPS))
            band = threshold_delta(up, low, EPS, confidence=0.999)
            est = importance_delta(up, EPS, z=4.0)
            violations += int(np.sum(band.lower > computed + 1e-12))
            for i, e in enumerate(EPS):
                print(f"  {direction:<9} {e:>5.2f} {computed[i]:>11.4e} {band.lower[i]:>12.4e} "
                      f"{est.estimate[i]:>12.4e} {est.upper[i] - est.estimate[i]:>9.1e}")
            rows.append((f"{name} ({direction})", computed, band.lower, est.estimate))
    print(f"\naudit lower bound above the computed curve: {violations} times (must be 0)")
    print(f"elapsed {time.perf_counter() - start:.1f} s")
    if plotting_available(args.no_plot):
        save_plot(rows, args.out)
    if violations:
        raise SystemExit(1)


def save_plot(rows, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (label, computed, lower, estimate), color in zip(rows, plt.cm.tab10.colors):
        ax.semilogy(EPS, computed, "-", color=color, label=label)
        ax.semilogy(EPS, np.maximum(lower, 1e-12), "v", color=color)
        ax.semilogy(EPS, np.maximum(estimate, 1e-12), "x", color=color)
    ax.set_xlabel("epsilon")
    ax.set_ylabel("delta")
    ax.set_title("curves (lines), audit lower bounds (v), Monte Carlo estimates (x)", fontsize=9)
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = out / "normalisation_monte_carlo.png"
    fig.savefig(path, dpi=120)
    print(f"saved {path}")


if __name__ == "__main__":
    main()
