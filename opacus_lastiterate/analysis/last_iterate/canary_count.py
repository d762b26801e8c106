"""Distribution of how often the canary is sampled: Binomial and Poisson-binomial.

Under the last-iterate heuristic the canary enters the final model K times, where K is the
number of steps whose Poisson sample contains it: K ~ Binomial(T, q) for a constant rate, and
a Poisson-binomial sum of Binomial(T_i, q_i) for a history of segments
(``docs/last_iterate.md``, "Varying noise multipliers and sample rates").

Tails are truncated at a Bernstein bound of about e^-75 per segment; the exact dropped mass
(from the regularised incomplete beta function) is returned so that callers can add it to
delta, which keeps every delta an upper bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

__all__ = []

_TAIL_NATS = 75.0  # truncation level of each binomial factor (Bernstein bound e^-75)


@dataclass(frozen=True)
class CountDistribution:
    """A sub-probability distribution on the integers ``offset + arange(len(log_pmf))``.

    ``dropped_mass`` is the probability of the truncated tails (the pmf sums to one minus it).
    """

    offset: int
    log_pmf: np.ndarray
    dropped_mass: float

    @property
    def support(self) -> np.ndarray:
        return self.offset + np.arange(self.log_pmf.size)


def _window(steps: int, q: float) -> tuple[int, int]:
    """Indices [lo, hi] outside of which Binomial(steps, q) has mass < 2 e^-75 (Bernstein)."""
    mean = steps * q
    var = steps * q * (1.0 - q)
    c = _TAIL_NATS
    t = c / 3.0 + math.sqrt(c * c / 9.0 + 2.0 * c * var)
    return max(0, math.floor(mean - t)), min(steps, math.ceil(mean + t))


def _dropped_mass(steps: int, q: float, lo: int, hi: int) -> float:
    """Pr[K < lo] + Pr[K > hi] for K ~ Binomial(steps, q), from the incomplete beta function."""
    dropped = 0.0
    if lo > 0:
        dropped += float(special.bdtr(lo - 1, steps, q))
    if hi < steps:
        dropped += float(special.bdtrc(hi, steps, q))
    return dropped


def binomial_count(steps: int, sample_rate: float) -> CountDistribution:
    """K ~ Binomial(steps, sample_rate), truncated to its Bernstein window."""
    if sample_rate == 1.0:
        return CountDistribution(steps, np.zeros(1), 0.0)
    lo, hi = _window(steps, sample_rate)
    dropped = _dropped_mass(steps, sample_rate, lo, hi)
    # log pmf up to a constant from the ratio pmf(k+1)/pmf(k) = (n-k)/(k+1) * q/(1-q), then
    # normalised to the kept mass 1 - dropped (exact, from the incomplete beta function).
    k = np.arange(lo, hi)
    log_odds = math.log(sample_rate) - math.log1p(-sample_rate)
    unnormalised = np.empty(hi - lo + 1)
    unnormalised[0] = 0.0
    np.cumsum(np.log((steps - k) / (k + 1.0)) + log_odds, out=unnormalised[1:])
    m = float(unnormalised.max())
    log_total = m + math.log(float(np.exp(unnormalised - m).sum()))
    log_pmf = unnormalised - log_total + math.log1p(-dropped)
    return CountDistribution(lo, log_pmf, dropped)


def binomial_count_stack(steps: np.ndarray, sample_rate: float) -> tuple[int, np.ndarray, np.ndarray]:
    """Binomial(n_b, q) for every n_b of ``steps`` (integers >= 1, increasing; q < 1) on one
    grid: ``(offset, log_pmf, dropped)`` with ``log_pmf[b, i]`` the log-probability of
    ``offset + i`` (-inf outside lane b's window) and ``dropped[b]`` its truncated mass.

    Windows, dropped masses and the log-pmf recursion are those of :func:`binomial_count`,
    evaluated for all lanes by the same floating-point operations (only the normalising sums
    may group their terms differently)."""
    counts = np.asarray(steps, dtype=np.int64)
    n = counts.astype(float)
    q = float(sample_rate)
    mean = n * q
    var = n * q * (1.0 - q)
    c = _TAIL_NATS
    t = c / 3.0 + np.sqrt(c * c / 9.0 + 2.0 * c * var)
    lo = np.maximum(0.0, np.floor(mean - t)).astype(np.int64)
    hi = np.minimum(n, np.ceil(mean + t)).astype(np.int64)
    dropped = np.where(lo > 0, special.bdtr(lo - 1, counts, q), 0.0) + np.where(
        hi < counts, special.bdtrc(hi, counts, q), 0.0
    )
    offset = int(lo.min())
    k = np.arange(offset, int(hi.max()) + 1, dtype=float)
    inside = (k[None, :] >= lo[:, None]) & (k[None, :] <= hi[:, None])
    log_odds = math.log(q) - math.log1p(-q)
    with np.errstate(divide="ignore", invalid="ignore"):
        increments = np.log((n[:, None] - k[None, :-1]) / (k[None, :-1] + 1.0)) + log_odds
    increments[~(inside[:, :-1] & inside[:, 1:])] = 0.0  # steps outside a window: exact zeros
    unnormalised = np.zeros((n.size, k.size))
    np.cumsum(increments, axis=1, out=unnormalised[:, 1:])
    unnormalised[~inside] = -math.inf
    top = unnormalised.max(axis=1, keepdims=True)
    log_total = top[:, 0] + np.log(np.exp(unnormalised - top).sum(axis=1))
    log_pmf = unnormalised - (log_total - np.log1p(-dropped))[:, None]
    return offset, log_pmf, dropped


class BinomialSequence:
    """Binomial(n, q) for n = n0, n0 + 1, ... at one rate q (a run growing by a step).

    Each count follows from the last by pmf_n(k) = pmf_{n-1}(k) n (1 - q) / (n - k), one
    multiplication per point instead of :func:`binomial_count`'s log, cumulative sum and
    normalisation; points entering the window come from their neighbour by the ratio
    pmf_n(k + 1) / pmf_n(k) = (n - k) q / ((k + 1)(1 - q)). Each update adds about two
    rounding errors per point, so the pmf is rebuilt by :func:`binomial_count` every
    ``rebuild_every`` steps (the drift stays below the 1e-13 relative error of
    :func:`binomial_count` itself, checked against 40-digit values), and whenever n does not
    follow on.
    Window and dropped mass are those of :func:`binomial_count`.
    """

    def __init__(self, sample_rate: float, rebuild_every: int = 64) -> None:
        self._q = sample_rate
        self._rebuild_every = rebuild_every
        self._n = -1
        self._lo = 0
        self._pmf = np.zeros(0)
        self._age = 0

    def count(self, steps: int) -> CountDistribution:
        """K ~ Binomial(steps, q), truncated to its Bernstein window."""
        q = self._q
        if steps != self._n + 1 or self._age >= self._rebuild_every or q == 1.0 or steps < 2:
            exact = binomial_count(steps, q)
            self._n, self._lo, self._pmf, self._age = steps, exact.offset, np.exp(exact.log_pmf), 0
            return exact
        n, old_lo = steps, self._lo
        k = np.arange(old_lo, old_lo + self._pmf.size, dtype=float)
        pmf = self._pmf * ((1.0 - q) * n / (n - k))
        lo, hi = _window(n, q)
        odds = q / (1.0 - q)
        old_hi = old_lo + pmf.size - 1
        if hi > old_hi:  # the window grew at the top
            top = [float(pmf[-1])]
            for j in range(old_hi, hi):
                top.append(top[-1] * (n - j) / (j + 1.0) * odds)
            pmf = np.concatenate((pmf, top[1:]))
        if lo < old_lo:  # ... or at the bottom
            bottom = [float(pmf[0])]
            for j in range(old_lo, lo, -1):
                bottom.append(bottom[-1] * j / ((n - j + 1.0) * odds))
            pmf = np.concatenate((bottom[:0:-1], pmf))
            old_lo = lo
        pmf = pmf[lo - old_lo : hi - old_lo + 1]
        self._n, self._lo, self._pmf, self._age = n, lo, pmf, self._age + 1
        return CountDistribution(lo, np.log(pmf), _dropped_mass(n, q, lo, hi))


def poisson_binomial_count(parts: Sequence[tuple[int, float]] | np.ndarray) -> CountDistribution:
    """K = sum_i Binomial(steps_i, q_i) for independent parts ``(steps_i, q_i)`` (pairs, or
    the rows of an array of two columns).

    The factors are convolved exactly in linear space (all terms are positive, so each
    output keeps its relative precision); the one-step parts of a rate schedule in blocks of
    :data:`_BLOCK` Bernoulli laws, each block's law built by the two-point step
    pmf(k) (1 - q) + pmf(k - 1) q for all blocks at once, the blocks then convolved in
    pairs, level by level. The dropped mass is the union bound of the factors' dropped
    masses.
    """
    table = np.asarray(parts, dtype=float)
    if table.size == 0:
        table = table.reshape(0, 2)
    if table.ndim != 2 or table.shape[1] != 2:
        raise ValueError(f"`parts` must be (steps, q) pairs, got shape {table.shape}.")
    table = table[table[:, 0] > 0]
    if not table.shape[0]:
        return CountDistribution(0, np.zeros(1), 0.0)
    if table.shape[0] == 1:
        return binomial_count(int(table[0, 0]), float(table[0, 1]))
    one_step = (table[:, 0] == 1.0) & (table[:, 1] < 1.0)
    offset, pmf, dropped = 0, np.ones(1), 0.0
    for n, q in table[~one_step].tolist():
        factor = binomial_count(int(n), q)
        offset += factor.offset
        dropped += factor.dropped_mass
        pmf = np.convolve(pmf, np.exp(factor.log_pmf))
    laws = list(_bernoulli_blocks(table[one_step, 1]))
    while len(laws) > 1:  # pairwise, so that long laws meet only near the top
        laws = [_trimmed(np.convolve(a, b)) for a, b in zip(laws[::2], laws[1::2])] + (
            laws[-1:] if len(laws) % 2 else [])
    if laws:
        pmf = np.convolve(pmf, laws[0])
    return _from_linear(offset, pmf, dropped)


def _trimmed(pmf: np.ndarray) -> np.ndarray:
    """``pmf`` without the zeros (underflow) at its upper end."""
    if pmf[-1] != 0.0:
        return pmf
    return pmf[: int(np.flatnonzero(pmf)[-1]) + 1]


_BLOCK = 16
"""Bernoulli laws per block of :func:`poisson_binomial_count`."""


def _bernoulli_blocks(rates: np.ndarray) -> np.ndarray:
    """The laws (rows, on 0 ... :data:`_BLOCK`) of the sums of consecutive blocks of
    Bernoulli(``rates``) (the last block padded with rate 0)."""
    if not rates.size:
        return np.empty((0, _BLOCK + 1))
    padded = np.zeros(-(-rates.size // _BLOCK) * _BLOCK)
    padded[: rates.size] = rates
    q = padded.reshape(-1, _BLOCK)
    pmf = np.zeros((q.shape[0], _BLOCK + 1))
    pmf[:, 0] = 1.0
    for j in range(_BLOCK):
        qj = q[:, j : j + 1]
        shifted = pmf[:, : j + 1] * qj
        pmf[:, : j + 2] *= 1.0 - qj
        pmf[:, 1 : j + 2] += shifted
    return pmf


def convolve_counts(a: CountDistribution, b: CountDistribution) -> CountDistribution:
    """The law of the sum of two independent counts (exact, in linear space); the dropped
    masses add (union bound)."""
    pmf = np.convolve(np.exp(a.log_pmf), np.exp(b.log_pmf))
    return _from_linear(a.offset + b.offset, pmf, a.dropped_mass + b.dropped_mass)


def _from_linear(offset: int, pmf: np.ndarray, dropped: float) -> CountDistribution:
    """A count from a linear-space pmf on ``offset + i``: log space, underflowed ends cut."""
    with np.errstate(divide="ignore"):
        log_pmf = np.log(pmf)
    finite = np.flatnonzero(np.isfinite(log_pmf))
    first, last = int(finite[0]), int(finite[-1])
    return CountDistribution(offset + first, log_pmf[first : last + 1], min(dropped, 1.0))
