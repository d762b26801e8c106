"""``poisson_gaussian_rdp`` against the library functions it reproduces: CPU milliseconds
(``time.process_time``, best of ``--repeat``; the machine may be shared) per (q, sigma) pair
at Opacus's 151 default orders, for N pairs along a noise schedule sigma_t = sigma0 * decay^t
(default 1 * 0.999^t, q = 0.0435: one new pair per step, as the privacy monitor's
``IncrementalRDP`` meets them under a noise scheduler), N = 1, 10, 100 and 1,000.

The reference is, for ``--series opacus``, Opacus's ``compute_rdp`` (what its
``RDPAccountant`` evaluates for every history entry at each ``get_epsilon``) called once per
pair, and for ``--series dp_accounting``, dp_accounting's per-pair RDP of a
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``. Also printed: the largest difference
in log(A) = (a - 1) RDP(a) at the fractional orders (Opacus stops its series at its first
term below e^-30 in each half and the module sums the whole tail, so they differ by up to
2 e^-30 plus Opacus's rounding, below 5e-13; dp_accounting: to rounding) and the largest
relative difference at the integer orders (rounding: their log(A) reaches thousands).

    python benchmarks/bench_rdp_series.py [--pairs 1 10 100 1000] [--series opacus]
        [--sigma0 1.0] [--decay 0.999] [--q 0.0435] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp import poisson_gaussian_rdp

DEFAULT_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus's


def reference(q: np.ndarray, sigma: np.ndarray, series: str) -> np.ndarray:
    """The library's one-step RDP of each pair at ``DEFAULT_ALPHAS``, one call per pair."""
    if series == "opacus":
        from opacus.accountants.analysis.rdp import compute_rdp

        return np.array([compute_rdp(q=float(a), noise_multiplier=float(s), steps=1,
                                     orders=DEFAULT_ALPHAS) for a, s in zip(q, sigma)])
    from dp_accounting.rdp.rdp_privacy_accountant import (
        _compute_rdp_poisson_subsampled_gaussian,
    )

    return np.array([_compute_rdp_poisson_subsampled_gaussian(float(a), float(s), DEFAULT_ALPHAS)
                     for a, s in zip(q, sigma)])


def _best(fns, repeat: int) -> list[float]:
    """The least CPU seconds of each of ``fns`` over ``repeat`` rounds (one call of each per
    round, in turn, so that both see the same state of the machine)."""
    best = [math.inf] * len(fns)
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t0 = time.process_time()
            fn()
            best[k] = min(best[k], time.process_time() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--series", default="opacus", choices=["opacus", "dp_accounting"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--q", type=float, default=0.0435)
    parser.add_argument("--decay", type=float, default=0.999)
    parser.add_argument("--sigma0", type=float, default=1.0)
    args = parser.parse_args()
    print(f"series={args.series} q={args.q} sigma_t={args.sigma0} * {args.decay}^t,"
          f" {len(DEFAULT_ALPHAS)} orders, CPU ms per pair (best of {args.repeat})")
    print(f"{'pairs':>6} {'library':>10} {'ours':>8} {'ratio':>8} {'frac |d log A|':>15}"
          f" {'int rel':>9}")
    orders = np.asarray(DEFAULT_ALPHAS)
    frac = orders != np.floor(orders)
    for n in args.pairs:
        sigma = args.sigma0 * args.decay ** np.arange(n)
        q = np.full(n, args.q)
        ours = poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series)
        ref = reference(q, sigma, args.series)
        finite = np.isfinite(ref) & np.isfinite(ours)
        gap = np.where(finite, np.abs(ours - ref), 0.0)
        frac_diff = np.max(gap[:, frac] * (orders[frac] - 1))
        int_rel = np.max(gap[:, ~frac] / np.maximum(np.abs(ref[:, ~frac]), 1e-300))
        repeat = args.repeat if n < 1000 else 1
        t_ours, t_ref = _best([
            lambda: poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series),
            lambda: reference(q, sigma, args.series),
        ], repeat)
        print(f"{n:>6} {1e3 * t_ref / n:>10.3f} {1e3 * t_ours / n:>8.3f} {t_ref / t_ours:>7.1f}x"
              f" {frac_diff:>15.1e} {int_rel:>9.1e}", flush=True)


if __name__ == "__main__":
    main()
