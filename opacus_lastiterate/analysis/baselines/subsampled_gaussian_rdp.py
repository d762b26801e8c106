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
    first term where both halves are below e^-30 (Opacus sets no cap on the number of
    terms; an entry still running after :data:`_OPACUS_VECTOR_TERMS` terms is +inf here,
    which is the safe side of an RDP bound).

The fractional series' Gaussian tail factors depend on the pair and on i or on a - i only,
so they are tabulated once per pair and shared by all orders (the orders a = k + f with the
same fractional part f share the values of a - i); Opacus's variant is then summed in a few
rounds of terms per order, each round reaching about where the series will stop (the rule
that stops it is unchanged, so the runs change the work, not the values). On Opacus's 151
orders this is about two to three times faster per pair than one Gaussian tail per term:
``benchmarks/bench_rdp_series.py``.

Special cases as in both references: q = 0 gives 0, sigma = 0 gives inf, q = 1 gives
a / (2 sigma^2). Values agree with the references to floating-point rounding (the sums are
taken in a different order): ``tests/analysis/baselines/test_subsampled_gaussian_rdp.py``.
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
_OPACUS_VECTOR_TERMS = 100_000
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
    if split.fracs:
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
    missing = [pair for pair in counts if pair not in cache]
    if missing:
        rows = poisson_gaussian_rdp(
            [q for _, q in missing], [s for s, _ in missing], key[1], series=series
        )
        if len(cache) + len(missing) > _CACHE_PAIRS:
            cache.clear()
        for pair, row in zip(missing, rows, strict=True):
            row.setflags(write=False)
            cache[pair] = row
    total = np.zeros(len(key[1]))
    for pair, n in counts.items():
        total += n * cache[pair]
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


class _Layout(NamedTuple):
    """Runs of terms i = start[k] ... start[k] + runs[k] - 1 of the orders ``ords[k]``, laid
    end to end: the runs' bounds; per term its i (int and float), a, log|C(a, i)|, the sign
    of C(a, i) and the column of a - i in the pair tables; the largest i + 1; the terms past
    the shared tables (i >= :data:`_SHARED_TERMS`, whose B1 is computed for each term: their
    positions and their a - i)."""

    runs: NDArray[np.intp]
    bounds: NDArray[np.intp]
    i: NDArray[np.intp]
    i_float: NDArray[np.float64]
    alpha: NDArray[np.float64]
    log_coef: NDArray[np.float64]
    sign: NDArray[np.float64]
    cols: NDArray[np.intp]
    end: int
    direct: NDArray[np.intp]
    direct_j: NDArray[np.float64]


_SHARED_TERMS = 4096  # terms i covered by the tables shared between calls (_order_tables)


def _layout(orders: tuple[float, ...], ords: NDArray[np.intp], start: NDArray[np.intp],
            runs: NDArray[np.intp]) -> _Layout:
    """The :class:`_Layout` of the runs (``ords``, ``start``, ``runs``) of ``orders``."""
    bounds = np.concatenate([[0], np.cumsum(runs)])
    end = int((start + runs).max())
    log_coef, sign, column = _order_tables(orders, min(_coef_terms(end), _SHARED_TERMS))
    terms = log_coef.shape[1]
    i = np.repeat(start - bounds[:-1], runs)
    i += np.arange(bounds[-1])
    alpha = np.repeat(np.asarray(orders, dtype=float)[ords], runs)
    direct = np.flatnonzero(i >= terms) if end > terms else np.empty(0, dtype=np.intp)
    at = np.repeat(ords * terms, runs)
    at += np.minimum(i, terms - 1) if direct.size else i
    lc, sg, cols = log_coef.ravel().take(at), sign.ravel().take(at), column.ravel().take(at)
    i_float = i.astype(float)
    direct_j = alpha[direct] - i_float[direct]
    if direct.size:  # the same expressions as _order_tables, term by term
        a, k = alpha[direct], i_float[direct]
        lc[direct] = special.gammaln(a + 1) - special.gammaln(k + 1) - special.gammaln(a - k + 1)
        sg[direct] = np.where(special.gammasgn(a - k + 1) > 0, 1.0, -1.0)
    return _Layout(runs, bounds, i, i_float, alpha, lc, sg, cols, end, direct, direct_j)


@functools.lru_cache(maxsize=16)
def _first_layout(orders: tuple[float, ...]) -> _Layout:
    """The layout of the first round: every order, i < :data:`_FIRST_RUN`."""
    n = len(orders)
    layout = _layout(orders, np.arange(n), np.zeros(n, dtype=np.intp),
                     np.full(n, _FIRST_RUN, dtype=np.intp))
    for part in layout:
        if isinstance(part, np.ndarray):
            part.setflags(write=False)
    return layout


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

    def run_terms(self, pairs: NDArray[np.intp], layout: _Layout,
                  ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """log_s0 and log_s1, shape (pairs, terms), of the terms of ``layout`` for each of
        ``pairs``."""
        if layout.end > self.terms:
            self._grow_b0(layout.end, pairs)
        self._grow_b1(layout.cols, pairs)
        rows = slice(None) if pairs.size == self.b0.shape[0] else pairs
        l1q = self.log_1mq[pairs, None]
        log_s0 = self.b0.take(layout.i, axis=1)[rows]
        log_s0 += layout.log_coef
        log_s0 += l1q * layout.alpha
        log_s1 = self.b1.take(layout.cols, axis=1)[rows]
        if layout.direct.size:
            j = layout.direct_j[None, :]
            s, z, tv = self.sigma[pairs, None], self.z0[pairs, None], self.two_var[pairs, None]
            log_s1[:, layout.direct] = (j * self.log_q[pairs, None] + (j * j - j) / tv
                                        + _LOG_HALF + _log_erfc((z - j) / (_SQRT2 * s)))
        log_s1 += layout.log_coef
        log_s1 += l1q * layout.i_float
        return log_s0, log_s1

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
    if series == "opacus":
        return _log_a_frac_opacus(q, sigma, orders)
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
    """Opacus's signed series at every (pair, order), in rounds. A round adds to each order
    a run of terms, the same for every pair (the runs of all orders laid end to end along
    the columns of one (pairs, terms) array); a pair whose series at that order has already
    stopped ignores the run. The first round takes :data:`_FIRST_RUN` terms; the next run
    of an order reaches where the larger half of the last term computed would be e^-30 if it
    fell as (a + 2) log i, as both halves do in the tail (the largest such reach over the
    pairs, and at least a quarter more terms than so far). Where a series stops is decided
    by its terms alone: the runs change the work, not the values."""
    n_pairs, n = q.size, len(orders)
    alpha = np.asarray(orders, dtype=float)
    tables = _PairTables(q, sigma, orders)
    # The sums of the two halves: exp(shift) * total (shift 0 until a term is too large).
    shift0, total0 = np.zeros((n_pairs, n)), np.zeros((n_pairs, n))
    shift1, total1 = np.zeros((n_pairs, n)), np.zeros((n_pairs, n))
    result = np.full((n_pairs, n), np.inf)
    active = np.ones((n_pairs, n), dtype=bool)
    start = np.zeros(n, dtype=np.intp)
    run = np.full(n, _FIRST_RUN, dtype=np.intp)
    every = np.arange(n_pairs)
    first_round = True
    while True:
        ords = np.flatnonzero(active.any(axis=0))
        if not ords.size:
            return result
        prs = np.flatnonzero(active.any(axis=1))
        rows = slice(None) if prs.size == n_pairs else prs[:, None]
        sub = (rows, ords)
        act = active[sub]
        if first_round:
            layout = _first_layout(orders)
            first_round = False
        else:
            layout = _layout(orders, ords, start[ords],
                             np.minimum(run[ords], _OPACUS_VECTOR_TERMS - start[ords]))
        runs, bounds, sign = layout.runs, layout.bounds, layout.sign
        log_s0, log_s1 = tables.run_terms(every if prs.size == n_pairs else prs, layout)
        top = np.maximum(log_s0, log_s1)
        width = top.shape[1]
        pos = np.arange(width)
        first = np.minimum.reduceat(np.where(top < -30, pos, width), bounds[:-1], axis=1)
        done = act & (first < bounds[1:])
        # The last term kept in each run: the stopping term, the run's end, or none.
        last = np.where(done, first, np.where(act, bounds[1:] - 1, bounds[:-1] - 1))
        tail = top[:, bounds[1:] - 1]
        weight = np.where(pos <= np.repeat(last, runs, axis=1), sign, 0.0)
        if float(top.max()) < _EXP_SAFE and not shift0.any() and not shift1.any():
            for log_s, total in ((log_s0, total0), (log_s1, total1)):
                np.exp(log_s, out=log_s)
                log_s *= weight
                total[sub] += np.add.reduceat(log_s, bounds[:-1], axis=1)
        else:
            for log_s, shift, total in ((log_s0, shift0, total0), (log_s1, shift1, total1)):
                shift[sub], total[sub] = _merge_shifted(shift[sub], total[sub], log_s, weight,
                                                        bounds, runs)
        if np.any(done):
            with np.errstate(divide="ignore", invalid="ignore"):
                both = np.logaddexp(shift0[sub] + np.log(total0[sub]),
                                    shift1[sub] + np.log(total1[sub]))
            result[sub] = np.where(done, both, result[sub])
        end = start[ords] + runs
        go = act & ~done & (end < _OPACUS_VECTOR_TERMS)
        active[sub] = go
        if np.any(go):
            with np.errstate(over="ignore"):
                reach = end * np.exp(np.maximum(tail + 30, 0.0) / (alpha[ords] + 2))
            want = np.max(np.where(go, 1.05 * reach + 4, 0.0), axis=0) - end
            want = np.clip(want, np.maximum(8, end // 4), _GROWTH * end)
            budget = _BLOCK_ELEMENTS / max(float(want.sum()) * prs.size, 1.0)
            run[ords] = np.maximum(8, want * min(budget, 1.0)).astype(np.intp)
            start[ords] = end


_FIRST_RUN = 32  # terms per order in the first round of Opacus's series
_GROWTH = 64  # a round adds at most this many times the terms an order has so far
_EXP_SAFE = 700.0  # below this, terms are summed as exp(log term) without a shift


def _merge_shifted(shift: NDArray[np.float64], total: NDArray[np.float64],
                   log_s: NDArray[np.float64], weight: NDArray[np.float64],
                   bounds: NDArray[np.intp], runs: NDArray[np.intp],
                   ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """exp(shift) * total plus, over each run, weight * exp(log_s) (weight: the sign of the
    term, 0 past the stopping term), as (shift, total) with the shift the largest kept term
    so far (``log_s`` is overwritten)."""
    kept = np.where(weight != 0.0, log_s, -np.inf)
    new = np.maximum(shift, np.maximum.reduceat(kept, bounds[:-1], axis=1))
    new = np.where(np.isfinite(new), new, 0.0)
    np.subtract(kept, np.repeat(new, runs, axis=1), out=log_s)
    np.exp(log_s, out=log_s)
    log_s *= weight
    return new, total * np.exp(shift - new) + np.add.reduceat(log_s, bounds[:-1], axis=1)


def _coef_terms(n: int) -> int:
    """The length of the coefficient table that covers i < n: 1,024 or the next power of 2."""
    return max(1024, 1 << (n - 1).bit_length())
