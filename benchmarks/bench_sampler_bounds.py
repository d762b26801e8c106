"""The two tightened sampler bounds against independent computations, with their times.

Shuffled batches (lower bound, ``shuffle_lower_bound_epsilon``): ours beside the
threshold-count bound it replaces and an independent numerical value of the same
max-statistic pair (closed-form density of the largest coordinate on a fine grid, its privacy
loss rounded to the nearest point of a 5e-4 grid, epochs composed by numpy's FFT; no
dp_accounting; error estimated by the change from a 1e-3 grid).

Balls-in-bins (upper bound): ``BallsInBinsBound``'s default (the grid it chooses from the run),
``random_allocation_pld`` at the coarse grid 0.05 and at finer ones, beside pld-accounting's
optimistic bound of the same pair (``BoundType.IS_DOMINATED``): the exact epsilon lies between
the two. The excess of the pessimistic value over the exact one is about linear in the grid, so
the line through the two finest grids, taken to a zero grid, estimates the exact value (it must
lie between the lower bound and our finest value).

    python benchmarks/bench_sampler_bounds.py [--fine 0.01,0.005] [--lower 0.02] [--quick]
        [--no-shuffle] [--default-only]

Prints Markdown tables (the ones in docs/samplers.md). Times are wall seconds on this machine;
each balls-in-bins value is computed in a fresh process (so that no cached grid is reused) and
timed there, in wall and in CPU seconds (the latter less sensitive to a shared machine's load).
pld-accounting uses numba when it is installed; the output says whether it was.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from scipy import optimize, special, stats

from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import BallsInBins
from opacus_lastiterate.analysis.sampling_allocation import (
    BallsInBinsBound,
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


# -- shuffled: the max-statistic pair -------------------------------------------------------


def _max_log_density(m: np.ndarray, sigma: float, k: int, mean: float) -> np.ndarray:
    a, z = (m - mean) / sigma, m / sigma
    first = stats.norm.logpdf(a) + (k - 1) * special.log_ndtr(z)
    if k == 1:
        return first - math.log(sigma)
    second = (math.log(k - 1) + special.log_ndtr(a) + (k - 2) * special.log_ndtr(z)
              + stats.norm.logpdf(z))
    return np.logaddexp(first, second) - math.log(sigma)


def _max_pair_delta(eps: float, sigma: float, k: int, epochs: int, grid: float) -> float:
    """delta of the E-fold max-statistic pair (P against Q): the largest coordinate's density on
    200,001 points (trapezoid rule), its privacy loss put on a uniform grid by nearest rounding,
    E-fold convolution by numpy's FFT."""
    m = np.linspace(-6 * sigma, 2 + 12 * sigma, 200_001)
    log_fp = _max_log_density(m, sigma, k, 2.0)
    loss = log_fp - _max_log_density(m, sigma, k, 1.0)
    mass = np.exp(log_fp) * (m[1] - m[0])
    mass[[0, -1]] /= 2
    lo = math.floor(loss.min() / grid)
    idx = np.rint(loss / grid).astype(int) - lo
    pmf = np.bincount(idx, weights=mass)
    size = epochs * (len(pmf) - 1) + 1
    spectrum = np.fft.rfft(pmf, n=1 << (size - 1).bit_length())
    total = np.clip(np.fft.irfft(spectrum**epochs)[:size], 0, None)
    values = (np.arange(size) + epochs * lo) * grid
    return float((total * np.clip(1 - np.exp(eps - values), 0, None)).sum())


def shuffle_reference(sigma: float, k: int, epochs: int) -> tuple[float, float]:
    """epsilon of the max-statistic pair at DELTA by :func:`_max_pair_delta` at a loss grid of
    1e-3, and its change when the grid is halved (the error estimate)."""
    coarse = _solve(lambda e: _max_pair_delta(e, sigma, k, epochs, 1e-3))
    fine = _solve(lambda e: _max_pair_delta(e, sigma, k, epochs, 5e-4))
    return fine, abs(fine - coarse)


def threshold_count_epsilon(sigma: float, k: int, epochs: int) -> float:
    c = np.linspace(-2 * sigma, 2 + 8 * sigma, 4001)
    a = 1 - stats.norm.cdf((c - 2) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    b = 1 - stats.norm.cdf((c - 1) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    cnt = np.arange(epochs + 1)[:, None]
    p, q = stats.binom.pmf(cnt, epochs, a), stats.binom.pmf(cnt, epochs, b)
    return _solve(lambda e: float(np.clip(p - math.exp(e) * q, 0, None).sum(axis=0).max()))


# -- balls-in-bins: the random-allocation pair ---------------------------------------------


def allocation_lower(sigma: float, b: int, epochs: int, disc: float) -> float:
    """pld-accounting's optimistic bound (``BoundType.IS_DOMINATED``) of one epoch, composed:
    the exact epsilon of the pair is at least this."""
    import PLD_accounting as pa

    config = pa.AllocationSchemeConfig(
        loss_discretization=disc, tail_truncation=1e-12, convolution_method=pa.ConvolutionMethod.GEOM
    )
    params = pa.PrivacyParams(sigma=sigma, num_steps=b, num_selected=1, num_epochs=1)
    pld = pa.gaussian_allocation_pld(params=params, config=config, bound_type=pa.BoundType.IS_DOMINATED)
    # an optimistic PLD composed by dp_accounting stays optimistic (dropped tails, losses down)
    return float((pld.self_compose(epochs) if epochs > 1 else pld).get_epsilon_for_delta(DELTA))


def _timed(f: object) -> tuple[float, float]:
    t = time.perf_counter()
    v = f()  # type: ignore[operator]
    return float(v), time.perf_counter() - t


def _cpu_timed(f: object) -> tuple[float, float, float]:
    """(value, wall seconds, CPU seconds of this process)."""
    c = time.process_time()
    v, t = _timed(f)
    return v, t, time.process_time() - c


def _allocation_value(
    sigma: float, b: int, e: int, grid: float | None
) -> tuple[float, float, float, float]:
    """(epsilon, wall seconds, CPU seconds, grid) of ``BallsInBinsBound`` at ``grid``
    (``None``: its default, the grid it chooses), or of pld-accounting's lower bound when
    ``grid`` is negative (at ``-grid``). Meant to run in a fresh process."""
    warnings.simplefilter("ignore", ImportWarning)
    if grid is not None and grid < 0:
        return (*_cpu_timed(lambda: allocation_lower(sigma, b, e, -grid)), -grid)
    run = DPSGDRun.from_history([(sigma, 1.0 / b, b * e)], sampling=BallsInBins(b))
    model = BallsInBinsBound(run, loss_discretization=grid)
    return (*_cpu_timed(lambda: model.epsilon(DELTA)), model.loss_discretization_for(DELTA))


def _fresh(*args: object) -> tuple[float, float, float, float]:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_allocation_value, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fine", default="0.01,0.005")
    parser.add_argument("--lower", type=float, default=0.02)
    parser.add_argument("--quick", action="store_true", help="the first setting of each only")
    parser.add_argument("--no-shuffle", action="store_true", help="balls-in-bins only")
    parser.add_argument("--default-only", action="store_true",
                        help="balls-in-bins: the default at the issue's two settings only")
    args = parser.parse_args()
    fine = [float(x) for x in args.fine.split(",") if x]
    warnings.simplefilter("ignore", ImportWarning)
    import PLD_accounting as pa

    print(f"delta = {DELTA}; pld-accounting numba: {pa.has_numba()}\n")
    if not args.no_shuffle:
        print("| shuffled: sigma, K, E | threshold count | ours (lower bound) [s] "
              "| max pair, numerical (grid change) [s] |")
        print("|---|---|---|---|")
        for sigma, k, e in SHUFFLE[:1] if args.quick else SHUFFLE:
            ours, t = _timed(lambda: shuffle_lower_bound_epsilon(
                DELTA, noise_multiplier=sigma, steps_per_epoch=k, epochs=e))
            t0 = time.perf_counter()
            ref, err = shuffle_reference(sigma, k, e)
            tr = time.perf_counter() - t0
            print(f"| {sigma}, {k}, {e} | {threshold_count_epsilon(sigma, k, e):.4f} | "
                  f"{ours:.4f} [{t:.1f}] | {ref:.4f} (+-{err:.0e}) [{tr:.0f}] |", flush=True)
    discs = [] if args.default_only else [0.05, *fine]
    print("\n| balls-in-bins: sigma, b, E | default (grid chosen) [wall s, CPU s] | " + "".join(
        f"at {d} [wall, CPU] | " for d in discs) + ("" if args.default_only else
        f"lower bound at {args.lower} [wall, CPU] | extrapolated to grid 0 | excess: default, "
        + ", ".join(map(str, discs)) + " |"))
    print("|---|---|" + ("" if args.default_only else "---|" * (len(discs) + 3)))
    for sigma, b, e in ALLOCATION[:1] if args.quick else ALLOCATION[: 2 if args.default_only else 4]:
        default, wd, cd, chosen = _fresh(sigma, b, e, None)
        line = f"| {sigma}, {b}, {e} | {default:.4f} ({chosen}) [{wd:.1f}, {cd:.1f}] |"
        if args.default_only:
            print(line, flush=True)
            continue
        values, cells = [], []
        for d in discs:
            v, w, c, _ = _fresh(sigma, b, e, d)
            values.append(v)
            cells.append(f" {v:.4f} [{w:.1f}, {c:.1f}] |")
        low, w, c, _ = _fresh(sigma, b, e, -args.lower)
        # the excess is about linear in the grid: the line through the two finest grids at 0
        (d1, v1), (d2, v2) = sorted(zip(discs, values))[:2]
        exact = v1 - d1 * (v2 - v1) / (d2 - d1)
        excess = ", ".join(f"{100 * (v / exact - 1):+.2f}%" for v in [default, *values])
        print(line + "".join(cells) + f" {low:.4f} [{w:.1f}, {c:.1f}] | {exact:.4f} | {excess} |",
              flush=True)


if __name__ == "__main__":
    main()
