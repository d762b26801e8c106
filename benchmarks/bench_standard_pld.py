"""Standard (all-iterates) epsilon: our route against dp_accounting's ``PLDAccountant``.

Both compose the same pessimistic connect-the-dots PLDs of the Poisson-subsampled Gaussian;
ours builds each one-step PLD with ``subsampled_gaussian_pld`` (the hockey-stick divergence
at every grid point as one numpy expression) where dp_accounting evaluates it point by point.
Prints, per configuration, the one-step build time of each route, the end-to-end time of the
standard epsilon (build + ``self_compose(T)`` + epsilon, the one-step cache cleared), the
ratios and the relative difference of the two epsilons. Best of ``--repeats``.

    python benchmarks/bench_standard_pld.py [--repeats 3] [--interval 1e-4]
"""

from __future__ import annotations

import argparse
import time

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.baselines.subsampled_gaussian_pld import subsampled_gaussian_pld

CONFIGS = [  # (T, q, sigma)
    (1000, 0.01, 1.0),
    (10000, 0.001, 0.8),
    (2468, 4096 / 50000, 3.0),
    (500, 0.1, 1.0),
    (100, 0.5, 5.0),
]
DELTA = 1e-5


def best(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        subsampled_gaussian_pld.cache_clear()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def reference(steps: int, q: float, sigma: float, interval: float) -> float:
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval
    )
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--interval", type=float, default=1e-4)
    args = parser.parse_args()
    iv, r = args.interval, args.repeats
    print(f"interval {iv:g}, delta {DELTA:g}, best of {r}; times in ms")
    print(f"{'T':>6} {'q':>8} {'sigma':>5} | {'build dp_acc':>12} {'ours':>7} {'ratio':>6} | "
          f"{'epsilon dp_acc':>14} {'ours':>7} {'ratio':>6} | {'rel. diff':>9}")
    for steps, q, sigma in CONFIGS:
        t_ref_build, _ = best(
            lambda: pld.from_gaussian_mechanism(sigma, sampling_prob=q,
                                                value_discretization_interval=iv), r)
        t_build, _ = best(lambda: subsampled_gaussian_pld(sigma, q, iv), r)
        t_ref, eps_ref = best(lambda: reference(steps, q, sigma, iv), r)
        t_ours, eps = best(lambda: StandardComposition(
            [(sigma, q, steps)], value_discretization_interval=iv).epsilon(DELTA), r)
        diff = abs(eps - eps_ref) / eps_ref  # type: ignore[operator]
        print(f"{steps:>6} {q:>8.4g} {sigma:>5g} | {1e3 * t_ref_build:>12.1f} {1e3 * t_build:>7.1f} "
              f"{t_ref_build / t_build:>6.1f} | {1e3 * t_ref:>14.1f} {1e3 * t_ours:>7.1f} "
              f"{t_ref / t_ours:>6.1f} | {diff:>9.1e}")


if __name__ == "__main__":
    main()
