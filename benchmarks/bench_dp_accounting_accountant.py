"""The heuristic through dp_accounting: our accountant against dp_accounting's PLD accountant.

The constant-rate Poisson heuristic is the pair Binomial(T, q) + N(0, sigma^2 T) against
N(0, sigma^2 T), which dp_accounting writes as a ``MixtureOfGaussiansDpEvent`` (sensitivities
k = 0..T with probabilities Binomial(T, q)(k), standard deviation sigma sqrt(T)) and answers
with its ``PLDAccountant``. Per configuration this prints the epsilon at delta = 1e-5 of
:class:`~opacus_lastiterate.analysis.LastIterateHeuristicAccountant` (composing the DP-SGD
event ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` T times) and of dp_accounting's
accountant on the mixture event, the difference (dp_accounting rounds the privacy loss up to
its grid: its epsilon is above ours by at most the interval), and the time per query of each
(compose + get_epsilon on a fresh accountant). Best of ``--repeats``.

    python benchmarks/bench_dp_accounting_accountant.py [--repeats 1] [--interval 1e-3]
        [--large]    # adds T = 1000 (dp_accounting: seconds to minutes per query)
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from scipy import stats

from opacus_lastiterate.analysis import LastIterateHeuristicAccountant

CONFIGS = [(100, 0.01, 1.0), (200, 0.05, 2.0), (30, 0.1, 1.5)]  # (T, q, sigma)
LARGE = [(1000, 0.01, 1.0)]
DELTA = 1e-5


def best(fn, repeats: int) -> tuple[float, float]:
    times, out = [], math.nan
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def ours(steps: int, q: float, sigma: float) -> float:
    acc = LastIterateHeuristicAccountant()
    acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(DELTA)


def mixture(steps: int, q: float, sigma: float, interval: float) -> float:
    k = np.arange(steps + 1)
    event = MixtureOfGaussiansDpEvent(
        sigma * math.sqrt(steps), k.astype(float).tolist(), stats.binom.pmf(k, steps, q).tolist()
    )
    acc = PLDAccountant(value_discretization_interval=interval)
    acc.compose(event)
    return acc.get_epsilon(DELTA)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--interval", type=float, default=1e-3)
    parser.add_argument("--large", action="store_true")
    args = parser.parse_args()
    print(f"delta {DELTA:g}, dp_accounting interval {args.interval:g}, best of {args.repeats}")
    print(f"{'T':>5} {'q':>5} {'sigma':>5} | {'eps ours':>9} {'eps PLD':>9} {'PLD - ours':>10} | "
          f"{'ms ours':>8} {'ms PLD':>9} {'ratio':>7}")
    for steps, q, sigma in CONFIGS + (LARGE if args.large else []):
        t_ours, e_ours = best(lambda: ours(steps, q, sigma), args.repeats)
        t_pld, e_pld = best(lambda: mixture(steps, q, sigma, args.interval), args.repeats)
        print(f"{steps:>5} {q:>5g} {sigma:>5g} | {e_ours:>9.5f} {e_pld:>9.5f} "
              f"{e_pld - e_ours:>10.2e} | {1e3 * t_ours:>8.2f} {1e3 * t_pld:>9.1f} "
              f"{t_pld / t_ours:>7.0f}")


if __name__ == "__main__":
    main()
