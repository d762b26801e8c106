"""``poisson_gaussian_rdp`` against the implementation it replaced (whose fractional-order
series evaluated the Gaussian tail once per term, half and order): milliseconds of CPU time
(``time.process_time``, best of ``--repeat``; the machine may be shared) per (q, sigma) pair
of one call on N pairs along a noise schedule sigma_t = sigma0 * decay^t (default 1 * 0.999^t,
q = 0.0435, Opacus's 151 default orders, ``series="opacus"`` as the privacy monitor's
``IncrementalRDP`` asks it: one new pair per step under a noise scheduler), for N = 1, 10,
100 and 1,000, and the largest difference between the two in log(A) = (a - 1) RDP(a) (the
reference stops Opacus's series at its first term below e^-30, the module sums the whole tail:
they differ by less than 5e-13 there; ``series="dp_accounting"``: to rounding).

The reference is a copy of the module's functions as they were before (commit 2ff1696), kept
here only to be timed against.

    python benchmarks/bench_rdp_series.py [--pairs 1 10 100 1000] [--series opacus]
        [--sigma0 1.0] [--decay 0.999] [--q 0.0435] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray
from scipy import special

from opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp import poisson_gaussian_rdp

DEFAULT_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))  # Opacus's

# -- the replaced implementation (reference only) -------------------------------------------

_DP_ACCOUNTING_TERMS = 1000  # dp_accounting's _MAX_STEPS_LOG_A_FRAC
_OPACUS_VECTOR_TERMS = 100_000
_BLOCK_ELEMENTS = 1 << 20  # array elements per block of work (about 8 MB of floats)
_FRAC_ENTRIES = 1024  # (pair, order) entries per block of the fractional series (cache-sized)
_LOG_HALF = math.log(0.5)
_LOG_TWO = math.log(2)
_SQRT2 = math.sqrt(2)

_SERIES = ("dp_accounting", "opacus")


def old_poisson_gaussian_rdp(
    sample_rates: Sequence[float] | NDArray[np.float64],
    noise_multipliers: Sequence[float] | NDArray[np.float64],
    orders: Sequence[float] | NDArray[np.float64],
    *,
    series: str = "dp_accounting",
) -> NDArray[np.float64]:
    """RDP of one Poisson-subsampled Gaussian step for each pair (``sample_rates[k]``,
    ``noise_multipliers[k]``) at each of ``orders``: an array of shape (pairs, orders).

    Args:
        sample_rates: Poisson rates q in [0, 1].
        noise_multipliers: noise multipliers sigma >= 0 (same length).
        orders: Renyi orders a > 1 (finite or inf).
        series: ``"dp_accounting"`` or ``"opacus"`` (the module docstring).
    """
    if series not in _SERIES:
        raise ValueError(f"`series` must be one of {_SERIES}, got {series!r}.")
    q = np.asarray(sample_rates, dtype=float).reshape(-1)
    sigma = np.asarray(noise_multipliers, dtype=float).reshape(-1)
    a = np.asarray(orders, dtype=float).reshape(-1)
    if q.shape != sigma.shape:
        raise ValueError(
            "`sample_rates` and `noise_multipliers` must have the same length, got "
            f"{q.size} and {sigma.size}."
        )
    if not np.all((q >= 0.0) & (q <= 1.0)):
        raise ValueError("`sample_rates` must lie in [0, 1].")
    if not np.all(np.isfinite(sigma) & (sigma >= 0.0)):
        raise ValueError("`noise_multipliers` must be finite and >= 0.")
    if not np.all(a > 1.0):
        raise ValueError("`orders` must all be > 1.")

    out = np.empty((q.size, a.size))
    finite = np.isfinite(a)
    is_int = finite & (a == np.floor(a))
    frac = finite & ~is_int
    out[:, ~finite] = np.inf
    general = (q > 0.0) & (q < 1.0) & (sigma > 0.0)
    full = (q == 1.0) & (sigma > 0.0)
    out[np.ix_(full, finite)] = a[finite][None, :] / (2.0 * sigma[full, None] ** 2)
    out[sigma == 0.0, :] = np.inf
    out[q == 0.0, :] = 0.0
    if np.any(general):
        qs, ss = q[general], sigma[general]
        part = np.empty((qs.size, a.size))
        part[:, ~finite] = np.inf
        if np.any(is_int):
            ints = a[is_int]
            part[:, is_int] = _log_a_int(qs, ss, tuple(ints.astype(int).tolist())) / (ints - 1.0)
        if np.any(frac):
            fr = a[frac]
            key = tuple(fr.tolist())
            step = max(1, _FRAC_ENTRIES // fr.size)
            for lo in range(0, qs.size, step):
                log_a = _log_a_frac(qs[lo:lo + step], ss[lo:lo + step], key, series)
                part[lo:lo + step, frac] = log_a / (fr - 1.0)
        out[general] = part
    return out


# -- integer orders ------------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _int_terms(
    orders: tuple[int, ...],
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.intp]]:
    """For the binomial expansions of all ``orders`` laid end to end: a, i, log C(a, i), and
    the start of each order's run of terms."""
    alpha = np.concatenate([np.full(n + 1, n, dtype=float) for n in orders])
    i = np.concatenate([np.arange(n + 1, dtype=float) for n in orders])
    log_coef = special.gammaln(alpha + 1) - special.gammaln(i + 1) - special.gammaln(alpha - i + 1)
    starts = np.concatenate([[0], np.cumsum([n + 1 for n in orders])[:-1]]).astype(np.intp)
    return alpha, i, np.asarray(log_coef, dtype=float), starts


def _log_a_int(q: NDArray[np.float64], sigma: NDArray[np.float64],
               orders: tuple[int, ...]) -> NDArray[np.float64]:
    """log A_a for integer a: log-sum-exp of each order's binomial expansion."""
    alpha, i, log_coef, starts = _int_terms(orders)
    out = np.empty((q.size, len(orders)))
    block = max(1, _BLOCK_ELEMENTS // alpha.size)
    quad = (i * i - i) / 2.0
    for lo in range(0, q.size, block):
        sl = slice(lo, lo + block)
        lq = np.log(q[sl])[:, None]
        l1q = np.log1p(-q[sl])[:, None]
        terms = log_coef + i * lq + (alpha - i) * l1q + quad / sigma[sl, None] ** 2
        top = np.maximum.reduceat(terms, starts, axis=1)
        lengths = np.diff(np.append(starts, alpha.size))
        scaled = np.exp(terms - np.repeat(top, lengths, axis=1))
        out[sl] = top + np.log(np.add.reduceat(scaled, starts, axis=1))
    return out


# -- fractional orders ---------------------------------------------------------------------


@functools.lru_cache(maxsize=16)
def _frac_log_coef(orders: tuple[float, ...]) -> NDArray[np.float64]:
    """log |C(a, i)| for each of ``orders`` and i < 1,000 (read-only)."""
    a = np.asarray(orders)[:, None]
    i = np.arange(_DP_ACCOUNTING_TERMS, dtype=float)[None, :]
    table = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
    table.setflags(write=False)
    return table


def _log_erfc(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """log(erfc(x)), as both references compute it."""
    return _LOG_TWO + special.log_ndtr(-x * 2**0.5)


def _log_a_frac(q: NDArray[np.float64], sigma: NDArray[np.float64],
                orders: tuple[float, ...], series: str) -> NDArray[np.float64]:
    """log A_a for fractional a at every (pair, order): the series run on all entries that
    have not stopped, a chunk of terms at a time."""
    n = len(orders)
    # Entries: pair index p and order index o, flattened.
    p = np.repeat(np.arange(q.size), n)
    o = np.tile(np.arange(n), q.size)
    alpha = np.asarray(orders)[o]
    log_q = np.log(q)[p]
    log_1mq = np.log1p(-q)[p]
    sig = sigma[p]
    z0 = (sigma**2 * np.log(1 / q - 1) + 0.5)[p]
    log_gamma_a1 = special.gammaln(alpha + 1)
    result = np.full(p.size, np.inf)
    # Running state of each entry.
    signed = series == "opacus"
    acc0 = np.full(p.size, -np.inf)  # log of the running sums (dp_accounting) or the shift
    acc1 = np.full(p.size, -np.inf)
    sum0 = np.zeros(p.size)  # scaled signed sums (opacus)
    sum1 = np.zeros(p.size)
    last0 = np.full(p.size, -np.inf)
    last1 = np.full(p.size, -np.inf)
    active = np.arange(p.size)
    cap = _DP_ACCOUNTING_TERMS if not signed else _OPACUS_VECTOR_TERMS
    start, chunk = 0, 8
    while active.size and start < cap:
        width = min(chunk, cap - start)
        width = max(1, min(width, _BLOCK_ELEMENTS // max(active.size, 1)))
        i = np.arange(start, start + width, dtype=float)[None, :]
        e = active
        a_e = alpha[e][:, None]
        j = a_e - i
        if start + width <= _DP_ACCOUNTING_TERMS:
            log_coef = _frac_log_coef(orders)[o[e], start:start + width]
        else:
            log_coef = log_gamma_a1[e][:, None] - special.gammaln(i + 1) - special.gammaln(j + 1)
        s_e = sig[e][:, None]
        two_var = 2 * s_e**2
        z = z0[e][:, None]
        lq, l1q = log_q[e][:, None], log_1mq[e][:, None]
        log_s0 = (log_coef + i * lq + j * l1q + (i * i - i) / two_var
                  + _LOG_HALF + _log_erfc((i - z) / (_SQRT2 * s_e)))
        log_s1 = (log_coef + j * lq + i * l1q + (j * j - j) / two_var
                  + _LOG_HALF + _log_erfc((z - j) / (_SQRT2 * s_e)))
        if signed:
            stop_here = np.maximum(log_s0, log_s1) < -30
            first = _first_true(stop_here)
            done = first < width
            upto = np.where(done, first + 1, width)
            keep = np.arange(width)[None, :] < upto[:, None]
            sign = np.where(special.gammasgn(j + 1) > 0, 1.0, -1.0)
            acc0[e], sum0[e] = _signed_update(acc0[e], sum0[e], log_s0, sign, keep)
            acc1[e], sum1[e] = _signed_update(acc1[e], sum1[e], log_s1, sign, keep)
            fin = e[done]
            with np.errstate(divide="ignore", invalid="ignore"):
                result[fin] = np.logaddexp(acc0[fin] + np.log(sum0[fin]),
                                           acc1[fin] + np.log(sum1[fin]))
        else:
            cum0 = np.logaddexp.accumulate(
                np.concatenate([acc0[e][:, None], log_s0], axis=1), axis=1)[:, 1:]
            cum1 = np.logaddexp.accumulate(
                np.concatenate([acc1[e][:, None], log_s1], axis=1), axis=1)[:, 1:]
            total = np.logaddexp(cum0, cum1)
            prev0 = np.concatenate([last0[e][:, None], log_s0[:, :-1]], axis=1)
            prev1 = np.concatenate([last1[e][:, None], log_s1[:, :-1]], axis=1)
            stop_here = ((log_s0 < prev0) & (log_s1 < prev1)
                         & (np.maximum(log_s0, log_s1) < total - 30))
            first = _first_true(stop_here)
            done = first < width
            fin = e[done]
            result[fin] = total[done, first[done]]
            acc0[e], acc1[e] = cum0[:, -1], cum1[:, -1]
            last0[e], last1[e] = log_s0[:, -1], log_s1[:, -1]
        active = e[~done]
        start += width
        chunk = min(2 * chunk, 256)
    return result.reshape(q.size, n)


def _first_true(mask: NDArray[np.bool_]) -> NDArray[np.intp]:
    """Index of the first True in each row, or the row length when there is none."""
    width = mask.shape[1]
    return np.where(mask.any(axis=1), mask.argmax(axis=1), width)


def _signed_update(shift: NDArray[np.float64], total: NDArray[np.float64],
                   log_terms: NDArray[np.float64], sign: NDArray[np.float64],
                   keep: NDArray[np.bool_]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Add sign * exp(log_terms) (where ``keep``) to the sum exp(shift) * total."""
    masked = np.where(keep, log_terms, -np.inf)
    new_shift = np.maximum(shift, masked.max(axis=1))
    safe = np.where(np.isfinite(new_shift), new_shift, 0.0)
    with np.errstate(invalid="ignore"):
        rescaled = np.where(np.isfinite(shift), total * np.exp(shift - safe), 0.0)
    added = np.sum(np.where(keep, sign * np.exp(masked - safe[:, None]), 0.0), axis=1)
    return new_shift, rescaled + added


# -- the benchmark ---------------------------------------------------------------------------


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
    print(f"{'pairs':>6} {'old ms/pair':>12} {'new ms/pair':>12} {'speed-up':>9}"
          f" {'max |d log A|':>14}")
    for n in args.pairs:
        sigma = args.sigma0 * args.decay ** np.arange(n)
        q = np.full(n, args.q)
        new = poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series)
        old = old_poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series)
        finite = np.isfinite(old) & np.isfinite(new)
        diff = np.max(np.where(finite, np.abs(new - old) * (np.asarray(DEFAULT_ALPHAS) - 1), 0))
        repeat = args.repeat if n < 1000 else 1
        t_new, t_old = _best([
            lambda: poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series),
            lambda: old_poisson_gaussian_rdp(q, sigma, DEFAULT_ALPHAS, series=args.series),
        ], repeat)
        print(f"{n:>6} {1e3 * t_old / n:>12.3f} {1e3 * t_new / n:>12.3f} {t_old / t_new:>8.1f}x"
              f" {diff:>14.1e}")


if __name__ == "__main__":
    main()
