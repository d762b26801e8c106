"""The two tightened sampler bounds against independent computations, with their times.

Shuffled batches (lower bound, ``shuffle_lower_bound_epsilon``): ours beside the
threshold-count bound it replaces and an independent estimate of the exact epsilon of the
same max-statistic pair (conditional Monte Carlo: every epoch but the first sampled exactly
under P, the first integrated by quadrature with the closed-form density of the largest
coordinate; the epsilon where the estimate crosses delta, with its 2-standard-error interval).

Balls-in-bins (upper bound, ``random_allocation_pld``): ours at the default
``loss_discretization`` and at finer ones, beside pld-accounting's optimistic bound of the same
pair (``BoundType.IS_DOMINATED``): the exact epsilon lies between the two, so ours is at most
(ours / lower - 1) above it.

    python benchmarks/bench_sampler_bounds.py [--fine 0.02,0.01] [--lower 0.02] [--samples 4000] [--quick]

Prints a Markdown table (the one in docs/samplers.md). Times are wall seconds on this machine
(pld-accounting uses numba when it is installed; the table says whether it was).
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
from scipy import optimize, special, stats

from opacus_lastiterate.analysis.sampling_allocation import (
    DEFAULT_LOSS_DISCRETIZATION,
    random_allocation_pld,
)
from opacus_lastiterate.analysis.sampling_standard import shuffle_lower_bound_epsilon

DELTA = 1e-5
SHUFFLE = [  # (sigma, steps per epoch, epochs): Chua et al.'s two, then two of ours
    (1.0, 10, 3), (1.5, 100, 5), (0.8, 1000, 2), (2.0, 50, 20),
]
ALLOCATION = [  # the two, then two of ours
    (0.8, 200, 3), (0.8, 1000, 1), (1.0, 100, 5), (0.6, 50, 10),
]
_X = np.linspace(-12.0, 12.0, 4001)  # quadrature nodes for a standard normal variable
_W = stats.norm.pdf(_X) * (_X[1] - _X[0])


def _solve(delta_of: object, lo: float = 0.0, hi: float = 60.0) -> float:
    return optimize.brentq(lambda e: delta_of(e) - DELTA, lo, hi, xtol=1e-6)  # type: ignore[operator]


def _interval(terms_of: object, n: int) -> tuple[float, float, float]:
    """epsilon where the mean of terms_of(eps) (n samples) equals DELTA, and where mean -/+ 2 SE
    does."""

    def at(eps: float, k: float) -> float:
        t = terms_of(eps)  # type: ignore[operator]
        return float(t.mean() + k * t.std(ddof=1) / math.sqrt(n))

    return tuple(_solve(lambda e, k=k: at(e, k)) for k in (0.0, -2.0, 2.0))  # type: ignore[return-value]


# -- shuffled: the max-statistic pair -------------------------------------------------------


def _max_log_density(m: np.ndarray, sigma: float, k: int, mean: float) -> np.ndarray:
    a, z = (m - mean) / sigma, m / sigma
    first = stats.norm.logpdf(a) + (k - 1) * special.log_ndtr(z)
    if k == 1:
        return first - math.log(sigma)
    second = (math.log(k - 1) + special.log_ndtr(a) + (k - 2) * special.log_ndtr(z)
              + stats.norm.logpdf(z))
    return np.logaddexp(first, second) - math.log(sigma)


def shuffle_reference(sigma: float, k: int, epochs: int, n: int, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    m = np.linspace(-6 * sigma, 2 + 12 * sigma, 2001)
    log_fp = _max_log_density(m, sigma, k, 2.0)
    loss = log_fp - _max_log_density(m, sigma, k, 1.0)
    w_first = np.exp(log_fp) * (m[1] - m[0])
    rest = np.zeros(n)
    for _ in range(epochs - 1):  # exact samples of the max under P, chunked
        mx = np.empty(n)
        for s in range(0, n, 2000):
            y = sigma * rng.standard_normal((min(2000, n - s), k))
            y[:, 0] += 2.0
            mx[s:s + len(y)] = y.max(axis=1)
        rest += np.interp(mx, m, loss)

    def terms(eps: float) -> np.ndarray:
        total = rest[:, None] + loss[None, :]
        return (np.clip(1 - np.exp(eps - total), 0, None) * w_first).sum(axis=1)

    return _interval(terms, n)


def threshold_count_epsilon(sigma: float, k: int, epochs: int) -> float:
    c = np.linspace(-2 * sigma, 2 + 8 * sigma, 4001)
    a = 1 - stats.norm.cdf((c - 2) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    b = 1 - stats.norm.cdf((c - 1) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    cnt = np.arange(epochs + 1)[:, None]
    p, q = stats.binom.pmf(cnt, epochs, a), stats.binom.pmf(cnt, epochs, b)
    return _solve(lambda e: float(np.clip(p - math.exp(e) * q, 0, None).sum(axis=0).max()))


# -- balls-in-bins: the random-allocation pair ---------------------------------------------


def allocation_lower(sigma: float, b: int, epochs: int, disc: float) -> float:
    """pld-accounting's optimistic bound (``BoundType.IS_DOMINATED``, epochs inside the package):
    the exact epsilon of the pair is at least this."""
    import PLD_accounting as pa

    config = pa.AllocationSchemeConfig(
        loss_discretization=disc, tail_truncation=1e-12, convolution_method=pa.ConvolutionMethod.GEOM
    )
    params = pa.PrivacyParams(sigma=sigma, num_steps=b, num_selected=1, num_epochs=epochs)
    pld = pa.gaussian_allocation_pld(params=params, config=config, bound_type=pa.BoundType.IS_DOMINATED)
    return float(pld.get_epsilon_for_delta(DELTA))


def _timed(f: object) -> tuple[float, float]:
    t = time.perf_counter()
    v = f()  # type: ignore[operator]
    return float(v), time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fine", default="0.02,0.01")
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--lower", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="the first setting of each only")
    args = parser.parse_args()
    fine = [float(x) for x in args.fine.split(",") if x]
    n = args.samples
    warnings.simplefilter("ignore", ImportWarning)
    import PLD_accounting as pa

    print(f"delta = {DELTA}; pld-accounting numba: {pa.has_numba()}\n")
    print("| shuffled: sigma, K, E | threshold count | ours (lower bound) [s] "
          "| max pair, conditional MC (2 SE) [s] |")
    print("|---|---|---|---|")
    for sigma, k, e in SHUFFLE[:1] if args.quick else SHUFFLE:
        ours, t = _timed(lambda: shuffle_lower_bound_epsilon(
            DELTA, noise_multiplier=sigma, steps_per_epoch=k, epochs=e))
        t0 = time.perf_counter()
        mid, lo, hi = shuffle_reference(sigma, k, e, n)
        tr = time.perf_counter() - t0
        print(f"| {sigma}, {k}, {e} | {threshold_count_epsilon(sigma, k, e):.4f} | "
              f"{ours:.4f} [{t:.1f}] | {mid:.4f} ({hi:.4f}-{lo:.4f}) [{tr:.0f}] |", flush=True)
    discs = [DEFAULT_LOSS_DISCRETIZATION, *fine]
    print("\n| balls-in-bins: sigma, b, E | " + " | ".join(
        f"ours at {d} [s]" for d in discs) + f" | lower bound at {args.lower} [s] |")
    print("|---|" + "---|" * (len(discs) + 1))
    for sigma, b, e in ALLOCATION[:1] if args.quick else ALLOCATION:
        cells = []
        for d in discs:
            v, t = _timed(lambda d=d: random_allocation_pld(
                sigma, b, e, loss_discretization=d).get_epsilon_for_delta(DELTA))
            cells.append(f"{v:.4f} [{t:.0f}]")
        low, t = _timed(lambda: allocation_lower(sigma, b, e, args.lower))
        print(f"| {sigma}, {b}, {e} | " + " | ".join(cells) + f" | {low:.4f} [{t:.0f}] |",
              flush=True)


if __name__ == "__main__":
    main()
