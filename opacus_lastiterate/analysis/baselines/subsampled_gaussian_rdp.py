"""Renyi DP of the Poisson-subsampled Gaussian mechanism for many (q, sigma) at once.

The RDP of one step (add/remove neighbours, Mironov, Talwar, Zhang, "Renyi Differential
Privacy of the Sampled Gaussian Mechanism", arXiv 1908.10530, Section 3.3) is
log(A_a) / (a - 1) at order a. This module evaluates the same series as the two reference
implementations, as array expressions over all pairs and orders instead of one Python loop
per (pair, order):

* integer orders: A_a = sum_{i=0}^{a} C(a, i) q^i (1 - q)^(a - i) exp((i^2 - i) / (2 sigma^2));
* fractional orders: the two-sided series of Section 3.3 with Gaussian tail factors, in one of
  two variants (``series``):

  - ``"dp_accounting"``: what dp_accounting's ``RdpAccountant`` composes for a
    ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``: every term added with ``|C(a, i)|``
    (an upper bound on A_a), stopped at the first term i >= 1 where both halves decrease and
    both are below the running total times e^-30; an order whose series has not stopped
    after 1,000 terms is +inf (dp_accounting then leaves it out of the conversion);
  - ``"opacus"``: Opacus's ``compute_rdp``: the terms signed as C(a, i), stopped after the
    first term where both halves are below e^-30.

The fractional series' Gaussian tail factors depend on the pair and on i or on a - i only,
so they are tabulated once per pair and shared by all orders (the orders a = k + f with the
same fractional part f share the values of a - i).

**Opacus's series in a fixed number of terms.** Its tail falls only like i^-(a + 2) (near
a = 1, some 16,000 terms before one is below e^-30). With z0 = sigma^2 log(1/q - 1) + 1/2,
the linear parts of the exponents cancel and each half's term is
C(a, i) (1 - q)^a exp(-z0^2 / (2 sigma^2)) E(x), E(x) = exp(x^2) erfc(x) / 2, at
x = (i - z0) / (sqrt(2) sigma) and x = (i - a + z0) / (sqrt(2) sigma). For i > a, ``|C(a, i)|``
is a Hausdorff moment sequence in i (a Beta integral) and so is E along either x (the
Laplace integral of exp(x^2) erfc(x)); so is their product, and the tail is an alternating
series of such a sequence. The first :data:`_DIRECT_TERMS` terms are summed as Opacus sums
them (stopped where it stops); if it has not stopped, the rest is summed by the
Cohen-Rodriguez Villegas-Zagier acceleration over :data:`_TAIL_TERMS` more terms (error below
2 * 5.83^-20, about 1e-15, of the first one). Opacus's value is that sum less each half's
terms after its stopping point, which alternate and decrease from one below e^-30 and have
one sign in both halves, so the two differ by less than 2 e^-30 (about 1.9e-13) in A_a, that
is in log A_a since A_a >= 1, plus the rounding of Opacus's log-space sums (a scan of 670,000
random triples found 2.9e-13 at most): 36 terms per (pair, order) instead of up to tens of
thousands (``benchmarks/bench_rdp_series.py`` times it against Opacus's ``compute_rdp``).
Where Opacus's stopping rule gives a log A_a below 0 (both halves of its first term already
below e^-30: custom fractional orders far above Opacus's, with a large sigma; Opacus then
returns a negative RDP), the whole series is summed instead (at least 0, as A_a >= 1).

Special cases as in both references: q = 0 gives 0, sigma = 0 gives inf, q = 1 gives
a / (2 sigma^2). Values agree with the references to floating-point rounding (the sums are
taken in a different order), and Opacus's fractional orders to within that truncation:
``tests/analysis/baselines/test_subsampled_gaussian_rdp.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray
from scipy import special

__all__ = []

_DP_ACCOUNTING_TERMS = 1000  # dp_accounting's _MAX_STEPS_LOG_A_FRAC
_BLOCK_ELEMENTS = 1 << 20  # array elements per block of work (about 8 MB of floats)
_FRAC_ENTRIES = 1024  # (pair, order) entries per block of the fractional series (cache-sized)
_LOG_HALF = math.log(0.5)
_LOG_TWO = math.log(2)
_SQRT2 = math.sqrt(2)

_SERIES = ("dp_accounting", "opacus")


def poisson_gaussian_rdp(
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
    split = _split_orders(tuple(a.tolist()))
    general = (q > 0.0) & (q < 1.0) & (sigma > 0.0)
    every = bool(general.all())
    if not every:
        finite = ~split.infinite
        out[:, split.infinite] = np.inf
        full = (q == 1.0) & (sigma > 0.0)
        out[np.ix_(full, finite)] = a[finite][None, :] / (2.0 * sigma[full, None] ** 2)
        out[sigma == 0.0, :] = np.inf
        out[q == 0.0, :] = 0.0
        if not np.any(general):
            return out
    qs, ss = (q, sigma) if every else (q[general], sigma[general])
    part = out if every else np.empty((qs.size, a.size))
    part[:, split.infinite] = np.inf
    if split.ints:
        part[:, split.int_cols] = _log_a_int(qs, ss, split.ints) / split.int_less_one
    if split.fracs and series == "opacus":
        part[:, split.frac_cols] = _log_a_frac_opacus(qs, ss, split.fracs) / split.frac_less_one
    elif split.fracs:
        step = max(1, _FRAC_ENTRIES // len(split.fracs))
        for lo in range(0, qs.size, step):
            log_a = _log_a_frac(qs[lo:lo + step], ss[lo:lo + step], split.fracs, series)
            part[lo:lo + step, split.frac_cols] = log_a / split.frac_less_one
    if not every:
        out[general] = part
    return out


class _Orders(NamedTuple):
    """Orders split by kind: which are inf, the columns and values (and a - 1) of the
    integer and of the fractional ones."""

    infinite: NDArray[np.bool_]
    int_cols: NDArray[np.intp]
    ints: tuple[int, ...]
    int_less_one: NDArray[np.float64]
    frac_cols: NDArray[np.intp]
    fracs: tuple[float, ...]
    frac_less_one: NDArray[np.float64]


@functools.lru_cache(maxsize=64)
def _split_orders(orders: tuple[float, ...]) -> _Orders:
    a = np.asarray(orders)
    finite = np.isfinite(a)
    is_int = finite & (a == np.floor(a))
    int_cols, frac_cols = np.flatnonzero(is_int), np.flatnonzero(finite & ~is_int)
    return _Orders(~finite, int_cols, tuple(int(x) for x in a[int_cols]), a[int_cols] - 1.0,
                   frac_cols, tuple(float(x) for x in a[frac_cols]), a[frac_cols] - 1.0)


_CACHE_PAIRS = 8192
_cache: dict[tuple[str, tuple[float, ...]], dict[tuple[float, float], NDArray[np.float64]]] = {}


def composed_rdp(
    steps: Sequence[tuple[float, float, int]],
    orders: Sequence[float],
    *,
    series: str = "dp_accounting",
) -> NDArray[np.float64]:
    """RDP at ``orders`` of a run given as ``[(noise_multiplier, sample_rate, steps), ...]``:
    the sum over its distinct (sigma, q) of the number of steps times the one-step RDP of
    :func:`poisson_gaussian_rdp` (computed once per distinct pair; the last
    :data:`_CACHE_PAIRS` pairs per (series, orders) are kept between calls)."""
    key = (series, tuple(float(a) for a in orders))
    cache = _cache.setdefault(key, {})
    counts: dict[tuple[float, float], int] = {}
    for sigma, q, n in steps:
        if n > 0:
            pair = (float(sigma), float(q))
            counts[pair] = counts.get(pair, 0) + int(n)
    found = {pair: cache[pair] for pair in counts if pair in cache}
    missing = [pair for pair in counts if pair not in found]
    if missing:
        rows = poisson_gaussian_rdp(
            [q for _, q in missing], [s for s, _ in missing], key[1], series=series
        )
        if len(cache) + len(missing) > _CACHE_PAIRS:
            cache.clear()
        keep = len(missing) <= _CACHE_PAIRS
        for pair, row in zip(missing, rows, strict=True):
            row.setflags(write=False)
            found[pair] = row
            if keep:
                cache[pair] = row
    total = np.zeros(len(key[1]))
    for pair, n in counts.items():
        total += n * found[pair]
    return total


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
#
# A term of either half is log|C(a, i)| plus a part that many (order, i) share:
#   log_s0 = log|C(a, i)| + a log(1 - q) + B0(i),
#   B0(i) = i (log q - log(1 - q)) + (i^2 - i) / (2 sigma^2) + log(1/2)
#           + log erfc((i - z0) / (sqrt(2) sigma)),
#   log_s1 = log|C(a, i)| + i log(1 - q) + B1(j),  j = a - i,
#   B1(j) = j log q + (j^2 - j) / (2 sigma^2) + log(1/2) + log erfc((z0 - j) / (sqrt(2) sigma)).
# B0 depends on the pair and i only, B1 on the pair and the value of a - i, which orders with
# the same fractional part share (Opacus's 90 fractional orders take about 9 distinct values
# of a - i per term, not 90). Both are tabulated once per pair (_PairTables), so the Gaussian
# tail, the costly part, is evaluated about ten times less often than once per term and half;
# log|C(a, i)| and its sign are tabulated once per set of orders (_order_tables).

@functools.lru_cache(maxsize=16)
def _order_tables(orders: tuple[float, ...], terms: int) -> tuple[
        NDArray[np.float64], NDArray[np.float64], NDArray[np.intp]]:
    """For each of ``orders`` (rows) and i < ``terms`` (columns): log |C(a, i)|, the sign of
    C(a, i), and the column of a - i in the pair tables (:func:`_differences`); read-only."""
    a = np.asarray(orders)[:, None]
    i = np.arange(terms, dtype=float)[None, :]
    log_coef = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
    sign = np.where(special.gammasgn(a - i + 1) > 0, 1.0, -1.0)
    column = np.ascontiguousarray(_differences(orders)[1][:, :terms])
    for table in (log_coef, sign, column):
        table.setflags(write=False)
    return log_coef, sign, column


_SHARED_TERMS = 4096  # terms i covered by the tables shared between calls (_order_tables)


@functools.lru_cache(maxsize=16)
def _differences(orders: tuple[float, ...]) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """The distinct values of a - i (as floats) over ``orders`` and i < :data:`_SHARED_TERMS`,
    largest first (the first terms' values in the first columns), and for each (order, i) the
    column of a - i among them (read-only)."""
    diff = np.asarray(orders, dtype=float)[:, None] - np.arange(_SHARED_TERMS, dtype=float)
    values, column = np.unique(diff, return_inverse=True)
    values, column = values[::-1].copy(), values.size - 1 - column.reshape(diff.shape)
    values.setflags(write=False)
    column.setflags(write=False)
    return values, column


def _log_erfc(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """log(erfc(x)), as both references compute it."""
    return _LOG_TWO + special.log_ndtr(-x * 2**0.5)


class _PairTables:
    """B0 (over i) and B1 (over the values of a - i) for each pair (rows), grown as the
    series of the pairs still summing need more terms."""

    def __init__(self, q: NDArray[np.float64], sigma: NDArray[np.float64],
                 orders: tuple[float, ...]) -> None:
        self.log_q = np.log(q)
        self.log_1mq = np.log1p(-q)
        self.sigma = sigma
        self.z0 = sigma**2 * np.log(1 / q - 1) + 0.5
        self.two_var = 2 * sigma**2
        self.values = _differences(orders)[0]
        self.orders = orders
        self.alpha = np.asarray(orders, dtype=float)
        self.terms = 0  # B0 covers i < terms, B1 the values of a - i where ``have``
        self.have = np.zeros(self.values.size, bool)
        self.b0 = np.empty((q.size, 0))
        self.b1 = np.empty((q.size, self.values.size))

    def _grow_b0(self, n: int, pairs: NDArray[np.intp]) -> None:
        """Make B0 cover i < n for ``pairs`` (the rows of other pairs are left stale)."""
        old = self.terms
        self.b0 = _widen(self.b0, n)
        lq, l1q = self.log_q[pairs, None], self.log_1mq[pairs, None]
        s, z, tv = self.sigma[pairs, None], self.z0[pairs, None], self.two_var[pairs, None]
        i = np.arange(old, n, dtype=float)[None, :]
        self.b0[pairs, old:n] = (i * (lq - l1q) + (i * i - i) / tv + _LOG_HALF
                                 + _log_erfc((i - z) / (_SQRT2 * s)))
        self.terms = n

    def _grow_b1(self, cols: NDArray[np.intp], pairs: NDArray[np.intp]) -> None:
        """Make B1 cover the values of a - i in ``cols`` for ``pairs``. A value is computed
        for the pairs still summing when it is first asked for; the pairs that sum later are
        among them."""
        values = self.values
        mark = np.zeros(int(cols.max()) + 1, bool)
        mark[cols] = True
        mark &= ~self.have[:mark.size]
        new = np.flatnonzero(mark)
        if new.size:
            lq = self.log_q[pairs, None]
            s, z, tv = self.sigma[pairs, None], self.z0[pairs, None], self.two_var[pairs, None]
            j = values[new][None, :]
            self.b1[np.ix_(pairs, new)] = (j * lq + (j * j - j) / tv + _LOG_HALF
                                           + _log_erfc((z - j) / (_SQRT2 * s)))
            self.have[new] = True

    def chunk_terms(self, p: NDArray[np.intp], o: NDArray[np.intp], start: int, width: int,
                    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """log_s0 and log_s1, shape (entries, width), of the terms i = start ... start +
        width - 1 of each entry (pair p[k], order o[k]); start + width <= 1,024."""
        end = start + width
        pairs = np.unique(p)
        if end > self.terms:
            self._grow_b0(end, pairs)
        log_coef, _, column = _order_tables(self.orders, _coef_terms(end))
        lc = log_coef[o, start:end]
        cols = column[o, start:end]
        self._grow_b1(cols, pairs)
        log_s0 = self.b0[p, start:end] + lc
        log_s0 += (self.alpha[o] * self.log_1mq[p])[:, None]
        log_s1 = self.b1.ravel().take(cols + (p * self.b1.shape[1])[:, None])
        log_s1 += lc
        log_s1 += self.log_1mq[p, None] * np.arange(start, end, dtype=float)
        return log_s0, log_s1


def _widen(table: NDArray[np.float64], width: int) -> NDArray[np.float64]:
    """``table`` with at least ``width`` columns (the first ones kept; room to grow)."""
    if table.shape[1] >= width:
        return table
    out = np.empty((table.shape[0], max(width, 2 * table.shape[1])))
    out[:, :table.shape[1]] = table
    return out


def _log_a_frac(q: NDArray[np.float64], sigma: NDArray[np.float64],
                orders: tuple[float, ...], series: str) -> NDArray[np.float64]:
    """log A_a for fractional a at every (pair, order), from the per-pair tables."""
    n = len(orders)
    # Entries: pair index p and order index o, flattened.
    p = np.repeat(np.arange(q.size), n)
    o = np.tile(np.arange(n), q.size)
    tables = _PairTables(q, sigma, orders)
    result = np.full(p.size, np.inf)
    # Running state of each entry: log of the running sums and the last terms.
    acc0 = np.full(p.size, -np.inf)
    acc1 = np.full(p.size, -np.inf)
    last0 = np.full(p.size, -np.inf)
    last1 = np.full(p.size, -np.inf)
    active = np.arange(p.size)
    cap = _DP_ACCOUNTING_TERMS
    start, chunk = 0, 8
    while active.size and start < cap:
        width = min(chunk, cap - start)
        width = max(1, min(width, _BLOCK_ELEMENTS // max(active.size, 1)))
        e = active
        log_s0, log_s1 = tables.chunk_terms(p[e], o[e], start, width)
        cum0 = np.logaddexp.accumulate(
            np.concatenate([acc0[e][:, None], log_s0], axis=1), axis=1)[:, 1:]
        cum1 = np.logaddexp.accumulate(
            np.concatenate([acc1[e][:, None], log_s1], axis=1), axis=1)[:, 1:]
        total = np.logaddexp(cum0, cum1)
        prev0 = np.concatenate([last0[e][:, None], log_s0[:, :-1]], axis=1)
        prev1 = np.concatenate([last1[e][:, None], log_s1[:, :-1]], axis=1)
        stop_here = ((log_s0 < prev0) & (log_s1 < prev1)
                     & (np.maximum(log_s0, log_s1) < total - 30))
        done = stop_here.any(axis=1)
        first = stop_here.argmax(axis=1)
        fin = e[done]
        result[fin] = total[done, first[done]]
        acc0[e], acc1[e] = cum0[:, -1], cum1[:, -1]
        last0[e], last1[e] = log_s0[:, -1], log_s1[:, -1]
        active = e[~done]
        start += width
        chunk = min(2 * chunk, 256)
    return result.reshape(q.size, n)


def _log_a_frac_opacus(q: NDArray[np.float64], sigma: NDArray[np.float64],
                       orders: tuple[float, ...]) -> NDArray[np.float64]:
    """Opacus's signed series at every (pair, order): the first terms as Opacus sums them
    (stopped where it stops), the alternating tail beyond them summed by the
    Cohen-Rodriguez Villegas-Zagier acceleration (module docstring)."""
    direct, log_coef, sign, values, column, weights = _opacus_tables(orders)
    n_orders, terms = log_coef.shape
    alpha = np.asarray(orders, dtype=float)
    i = np.arange(terms, dtype=float)
    out = np.empty((q.size, n_orders))
    block = max(1, _BLOCK_ELEMENTS // (n_orders * terms))
    for lo in range(0, q.size, block):
        sl = slice(lo, lo + block)
        lq, l1q = np.log(q[sl])[:, None], np.log1p(-q[sl])[:, None]
        s = sigma[sl, None]
        tv = 2 * s**2
        z0 = s**2 * np.log(1 / q[sl, None] - 1) + 0.5
        b0 = i * (lq - l1q) + (i * i - i) / tv + _LOG_HALF + _log_erfc((i - z0) / (_SQRT2 * s))
        b1 = (values * lq + (values * values - values) / tv + _LOG_HALF
              + _log_erfc((z0 - values) / (_SQRT2 * s)))
        log_s0 = log_coef + (alpha * l1q)[:, :, None] + b0[:, None, :]
        log_s1 = log_coef + (i * l1q)[:, None, :] + b1[:, column]
        # Opacus stops after the first term whose halves are both below e^-30
        below = np.maximum(log_s0[..., :direct], log_s1[..., :direct]) < -30
        stopped = below.any(axis=-1)
        kept = np.arange(direct) <= np.where(stopped, below.argmax(axis=-1), direct)[..., None]
        log_a = _summed(log_s0, log_s1, kept, stopped, sign, weights, direct)
        short = log_a < 0.0  # stopped before the terms that make A_a >= 1: the whole series
        if np.any(short):
            whole = _summed(log_s0, log_s1, np.ones_like(kept), np.zeros_like(stopped), sign,
                            weights, direct)
            log_a = np.where(short, np.maximum(whole, 0.0), log_a)
        out[sl] = log_a
    return out


def _summed(log_s0: NDArray[np.float64], log_s1: NDArray[np.float64], kept: NDArray[np.bool_],
            stopped: NDArray[np.bool_], sign: NDArray[np.float64], weights: NDArray[np.float64],
            direct: int) -> NDArray[np.float64]:
    """log A_a from the terms of both halves (pairs, orders, terms): the first ``direct``
    terms where ``kept``, the accelerated tail where not ``stopped``; inf where a half's sum
    is not positive."""
    halves = []
    for log_s in (log_s0, log_s1):
        head = np.where(kept, log_s[..., :direct], -np.inf)
        shift = head.max(axis=-1)
        total = np.einsum("poi,oi->po", np.exp(head - shift[..., None]), sign[:, :direct])
        tail = np.exp(log_s[..., direct:] - shift[..., None]) @ weights
        total += np.where(stopped, 0.0, sign[:, direct] * tail)
        with np.errstate(divide="ignore", invalid="ignore"):
            halves.append(np.where(total > 0, shift + np.log(total), np.inf))
    return np.logaddexp(halves[0], halves[1])


_DIRECT_TERMS = 16  # terms summed one by one (at least the largest order + 2)
_TAIL_TERMS = 20  # terms of the accelerated tail: error below 2 * 5.8^-20 of its first term


@functools.lru_cache(maxsize=16)
def _opacus_tables(orders: tuple[float, ...]) -> tuple[
        int, NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.intp],
        NDArray[np.float64]]:
    """For Opacus's series at ``orders``: the number of terms summed one by one, then per
    order (rows) and term (columns) log ``|C(a, i)|`` and the sign of C(a, i), the distinct
    values of a - i and the column of each (order, term) among them, and the weights of the
    accelerated tail."""
    direct = max(_DIRECT_TERMS, int(max(orders)) + 2)
    a = np.asarray(orders, dtype=float)[:, None]
    i = np.arange(direct + _TAIL_TERMS, dtype=float)[None, :]
    log_coef = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(a - i + 1)
    sign = np.where(special.gammasgn(a - i + 1) > 0, 1.0, -1.0)
    values, column = np.unique(a - i, return_inverse=True)
    tables = (log_coef, sign, values, column.reshape(log_coef.shape), _cvz_weights())
    for table in tables:
        table.setflags(write=False)
    return (direct, *tables)


def _cvz_weights(n: int = _TAIL_TERMS) -> NDArray[np.float64]:
    """w with sum_k (-1)^k a_k ~ sum_k w_k a_k for a completely monotone a (Cohen,
    Rodriguez Villegas, Zagier, "Convergence acceleration of alternating series",
    Experimental Mathematics 9 (2000), Algorithm 1); the signs (-1)^k are in w."""
    d = (3 + math.sqrt(8)) ** n
    d = (d + 1 / d) / 2
    b, c = -1.0, -d
    weights = np.empty(n)
    for k in range(n):
        c = b - c
        weights[k] = c / d
        b = (k + n) * (k - n) * b / ((k + 0.5) * (k + 1))
    return weights


def _coef_terms(n: int) -> int:
    """The length of the coefficient table that covers i < n: 1,024 or the next power of 2."""
    return max(1024, 1 << (n - 1).bit_length())
