"""Certified maximum over t of the heuristic epsilon of the last t steps.

For a history of segments (sigma_i, q_i, T_i), oldest first, the last t steps give the pair

    P_t = C_t + N(0, s_t^2)   against   Q_t = N(0, s_t^2),

with C_t the Poisson-binomial count of those steps and s_t^2 the sum of their T_i sigma_i^2;
eps_t is its epsilon at the target delta (:mod:`.heuristic`). The robust heuristic is
max_{1 <= t <= T} eps_t, the value a regulariser that zeroes the model would expose
("The Last Iterate Advantage", arXiv 2410.06186). :func:`certified_suffix_maximum` returns a value ``attained`` that is
some eps_t and an upper bound ``epsilon`` on every eps_t, with
``epsilon <= attained * (1 + rtol)``. The upper bound is proved, not searched for.

The bound. For lo < t < hi (anywhere in the run, across segment boundaries),

    eps_t <= eps of the pair (C_{hi-1} + N(0, s_{lo+1}^2), N(0, s_{lo+1}^2)).        (*)

Proof, for both directions of the hockey-stick divergence H_g (g = e^eps >= 0):

1. Noise (data processing). (C + N(0, s^2), N(0, s^2)) with s >= s' is the image of
   (C + N(0, s'^2), N(0, s'^2)) under the one kernel y -> y + N(0, s^2 - s'^2), so its
   divergences are no larger. Apply it with s = s_k >= s_{k1} = s'.
2. Count (stochastic order). Let X <= X' in the usual stochastic order, both >= 0, and
   P_X = Law(X + N(0, s^2)), Q = N(0, s^2). The likelihood ratio dP_X/dQ (y) = E exp(X y / s^2
   - X^2 / (2 s^2)) is non-decreasing in y, so the optimal set for H_g(P_X || Q) is an upper
   half-line A and that for H_g(Q || P_X) a lower half-line B (Neyman-Pearson). P_X(A) =
   E Pr[N(X, s^2) in A] is the mean of a non-decreasing function of X, hence
   P_X(A) <= P_X'(A) and P_X(B) >= P_X'(B), which gives
   H_g(P_X || Q) = P_X(A) - g Q(A) <= P_X'(A) - g Q(A) <= H_g(P_X' || Q) and likewise
   H_g(Q || P_X) = Q(B) - g P_X(B) <= Q(B) - g P_X'(B) <= H_g(Q || P_X').
   Apply it with X = C_t and X' = C_{hi-1}, which is C_t plus the independent Bernoulli
   draws of the hi - 1 - t older steps (at their own rates): adding draws only moves the
   count up.

Since every delta_t(eps) <= delta^(*)(eps), every eps_t(delta) <= eps^(*)(delta). The bound
pair is a :class:`ShiftedGaussianMixture` like the exact ones, evaluated by the same
engine, and bounds over sub-intervals are never larger (the same two steps), so a child
interval may keep its parent's bound until it is needed. Relative to eps_t the slack of (*)
is of order (hi - lo) / lo, so coarse intervals certify wherever eps_t is well below the
maximum and only the neighbourhood of the maximiser is refined.

The search (branch and bound). With at most 64 non-empty segments, eps_t is evaluated per
segment j (t = L + k, L the steps of the later segments) at k = 1, at a geometric grid of
ratio 8 and at k = T_j; with more (noise or rate changing every step), at t = 1, a geometric
grid of ratio 8 and t = T over the whole run, so that the work grows with the number of
evaluations the maximum needs, not with the number of segments. The gaps between evaluated points wait in a max-heap keyed by an
upper bound on their interior: their own bound (*) or one inherited from the gap they were
split from. The top gap gets its own bound if it has none yet and is accepted if that bound
is at most ``attained * (1 + rtol)``; otherwise it is split at its midpoint, which is
evaluated. Interiors of one or two steps are evaluated outright. The search stops when the
top key is certified; ``epsilon`` is the maximum of ``attained``, the accepted bounds and
that key.

Cost. The run is held as arrays over its segments (newest first) with running sums of
steps per rate and of the variance, so that a bound costs O(log n) to set up and an exact
eps_t O(n) array work for its variance (summed oldest first, as the heuristic sums it, so
that eps_t is the heuristic of that suffix to the last bit); the solve of the pair dominates.

Numerics. The variance of a bound pair is the running sum from the newest step scaled by
1 - 3 (n + 1) 2^-53 (n segments): every float sum of the same non-negative terms, in any
order, lies within that factor of the real sum, so the bound's variance is never above the
float variance of a pair it bounds. Every bound is padded by
1e-12 relative plus 1e-14 absolute for the root finder of the engine, and the acceptance
target is ``attained * (1 + rtol) + 2e-14``. The proof bounds the exact eps_t of the
untruncated pairs; the engine's eps_t exceed those only through the truncated count tails
(mass below 1e-31, added to delta_PQ; in delta_QP at most e^eps times it), which is
negligible beside the pad unless delta comes within a few orders of that.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.last_iterate.canary_count import poisson_binomial_count
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair
from opacus_lastiterate.analysis.run import TrainingSegment, total_steps

__all__ = []

_REL_PAD = 1e-12  # safety margin on every bound for the root finder of the engine: relative
_ABS_PAD = 1e-14  # and absolute (eps near 0); the acceptance target allows 2 * _ABS_PAD
_GRID_RATIO = 8  # initial grid per segment: k = 1, 8, 64, ..., T_j
_EXHAUSTIVE_INTERIOR = 2  # interiors of at most this many steps are evaluated outright
_PER_SEGMENT_GRIDS = 64  # up to this many non-empty segments, one initial grid per segment
_RATE_TABLE_MAX = 16  # up to this many distinct rates, running steps per rate are tabled


@dataclass(frozen=True)
class SuffixMaximum:
    """max_{1 <= t <= T} eps_t (eps_t: the heuristic of the last t steps), certified.

    ``attained`` = eps at ``argmax_steps`` (the largest evaluated value, ties to the larger
    t) <= max_t eps_t <= ``epsilon`` <= ``attained * (1 + rtol)``; ``evaluations`` counts the
    exact eps_t computed (bounds not included). All zero for an empty history.
    """

    epsilon: float
    attained: float
    argmax_steps: int
    evaluations: int


def _count_epsilon(parts: np.ndarray, variance: float, delta: float) -> float:
    """Epsilon of the pair with the count of ``parts`` (rows (steps, q), by increasing q)
    and noise ``variance``: the construction of :func:`.heuristic_pair.segments_pair`.
    No steps: 0 (P == Q); steps without noise: inf (the count is seen exactly)."""
    if variance == 0.0:
        return math.inf if bool(np.any(parts[:, 0] > 0)) else 0.0
    return count_pair(poisson_binomial_count(parts), variance).epsilon(delta)


class _Search:
    """Exact eps_t (cached) and the bound (*) on the interior of an interval (lo, hi).

    The run is held as arrays over its non-empty segments, newest first, so that the pair of
    any suffix costs O(log n) to locate and O(n) array work (not Python objects) to build:
    steps, sigma^2 and the index of the sample rate of each segment, and the running sums of
    steps and of the variance from the newest step back."""

    def __init__(self, segments: tuple[TrainingSegment, ...], delta: float) -> None:
        kept = [seg for seg in reversed(segments) if seg.steps > 0]
        self._delta = delta
        self._steps = np.array([seg.steps for seg in kept], dtype=np.int64)
        # sigma**2 in Python floats, as segments_pair computes it.
        self._sig2 = np.array([seg.noise_multiplier**2 for seg in kept], dtype=float)
        rates = np.array([seg.sample_rate for seg in kept], dtype=float)
        self._rates, self._rate_index = np.unique(rates, return_inverse=True)
        # Few rates: the running steps per rate from the newest segment back (rows: rates).
        self._steps_per_rate = None
        if self._rates.size <= _RATE_TABLE_MAX:
            table = np.zeros((self._rates.size, len(kept)), dtype=np.int64)
            table[self._rate_index, np.arange(len(kept))] = self._steps
            self._steps_per_rate = np.cumsum(table, axis=1)
        self._ends = np.cumsum(self._steps)  # steps of the newest j + 1 segments
        self._terms = self._steps * self._sig2  # steps * sigma^2, newest first
        self._variance_from_end = np.cumsum(self._terms)
        # Every float sum of n >= 1 non-negative terms lies within (n - 1) u of the real sum
        # (u = 2^-53); scaling the bound's variance by (1 - 3 (n + 1) u) keeps it below the
        # float variance of every pair it bounds, whatever the order of summation.
        self._variance_pad = 1.0 - 3.0 * (len(kept) + 1) * 2.0**-53
        self.values: dict[int, float] = {}
        self.best = (-math.inf, 0)  # (largest eps_t, its t); ties go to the larger t

    def _locate(self, t: int) -> tuple[int, int]:
        """(j, k): the last t steps are the newest j segments and k >= 1 steps of segment j."""
        j = int(np.searchsorted(self._ends, t, side="left"))
        return j, t - (int(self._ends[j - 1]) if j else 0)

    def _parts(self, t: int) -> np.ndarray:
        """Steps per sample rate of the last t steps, rows (steps, q) by increasing q."""
        j, k = self._locate(t)
        if self._steps_per_rate is None:
            counts = np.bincount(
                self._rate_index[:j], weights=self._steps[:j], minlength=self._rates.size
            ).astype(np.int64)
        elif j:
            counts = self._steps_per_rate[:, j - 1].copy()
        else:
            counts = np.zeros(self._rates.size, dtype=np.int64)
        counts[self._rate_index[j]] += k
        kept = counts > 0
        return np.column_stack([counts[kept], self._rates[kept]])

    def _variance(self, t: int) -> float:
        """The noise variance of the last t steps summed oldest first, the floating-point
        order of :func:`.heuristic_pair.segments_pair`."""
        j, k = self._locate(t)
        first = k * float(self._sig2[j])
        if j == 0:
            return first
        return float(np.cumsum(np.concatenate(([first], self._terms[j - 1 :: -1])))[-1])

    def _variance_lower(self, t: int) -> float:
        """A float at most the variance of the last t' >= t steps in any order of summation."""
        j, k = self._locate(t)
        before = float(self._variance_from_end[j - 1]) if j else 0.0
        return (before + k * float(self._sig2[j])) * self._variance_pad

    def exact(self, t: int) -> None:
        if t not in self.values:
            value = _count_epsilon(self._parts(t), self._variance(t), self._delta)
            self.values[t] = value
            self.best = max(self.best, (value, t))

    def bound(self, lo: int, hi: int) -> float:
        """Upper bound on eps_t for lo < t < hi: count of hi - 1 steps, noise of lo + 1 steps
        (rounded down, so that the float variance stays below that of every t bounded)."""
        eps = _count_epsilon(self._parts(hi - 1), self._variance_lower(lo + 1), self._delta)
        if not eps > 0.0:
            return 0.0
        return eps + eps * _REL_PAD + _ABS_PAD if math.isfinite(eps) else math.inf


def _segment_grid(start: int, steps: int) -> list[int]:
    """t = start + k for k = 1, 8, 64, ... and k = steps (the range of one segment)."""
    ks = {1, steps}
    k = _GRID_RATIO
    while k < steps:
        ks.add(k)
        k *= _GRID_RATIO
    return [start + k for k in sorted(ks)]


def certified_suffix_maximum(
    segments: tuple[TrainingSegment, ...], delta: float, *, rtol: float = 1e-6
) -> SuffixMaximum:
    """Certified max over 1 <= t <= T of the heuristic epsilon of the last t steps.

    Args:
        segments: history of validated segments, oldest first.
        delta: target delta in (0, 1).
        rtol: relative gap allowed between the certified bound and the attained value
            (>= 0; 0 refines until no bound exceeds the attained value).

    Returns:
        :class:`SuffixMaximum` with ``attained <= max_t eps_t <= epsilon <=
        attained * (1 + rtol)``; the bound is the proof of the module docstring.
    """
    delta = check_delta(delta)
    rtol = check_in_interval("rtol", rtol, 0.0, math.inf, low_open=False)
    search = suffix_maximum_search(segments, delta, rtol)
    while True:
        try:
            next(search)
        except StopIteration as done:
            result: SuffixMaximum = done.value
            return result


def suffix_maximum_search(
    segments: tuple[TrainingSegment, ...], delta: float, rtol: float = 1e-6
) -> Generator[None, None, SuffixMaximum]:
    """:func:`certified_suffix_maximum` as a generator (validated arguments) that yields after
    every exact evaluation and returns the :class:`SuffixMaximum`: a caller can spread one
    search over several calls (the accountant's non-monotonicity check does)."""
    n = total_steps(segments)
    if n == 0:
        return SuffixMaximum(0.0, 0.0, 0, 0)
    search = _Search(segments, delta)

    # Gaps (lo, hi) between evaluated points with a non-empty interior: within each
    # segment's range for a few segments; over the whole range 1..T for many (the bound
    # holds across segment boundaries).
    if sum(1 for seg in segments if seg.steps > 0) <= _PER_SEGMENT_GRIDS:
        grids = []
        later = 0
        for seg in reversed(segments):
            if seg.steps > 0:
                grids.append(_segment_grid(later, seg.steps))
                later += seg.steps
    else:
        grids = [_segment_grid(0, n)]
    gaps: list[tuple[int, int]] = []
    for grid in grids:
        for t in grid:
            search.exact(t)
            yield
        gaps += [(a, b) for a, b in itertools.pairwise(grid) if b - a > 1]

    # Max-heap of (-key, lo, hi, exact?): key is the interval's own bound when exact, else a
    # bound inherited from an enclosing interval (never smaller than its own).
    heap = [(-math.inf, lo, hi, False) for lo, hi in gaps]
    heapq.heapify(heap)
    accepted = 0.0
    while heap:
        target = search.best[0] * (1.0 + rtol) + 2.0 * _ABS_PAD
        key, lo, hi, is_exact = heap[0]
        if -key <= target:
            accepted = max(accepted, -key)  # bounds every interval still in the heap
            break
        heapq.heappop(heap)
        if hi - lo - 1 <= _EXHAUSTIVE_INTERIOR:
            for t in range(lo + 1, hi):
                search.exact(t)
                yield
            continue
        if not is_exact:
            own = search.bound(lo, hi)
            yield
            if own <= target:
                accepted = max(accepted, own)
            else:
                heapq.heappush(heap, (-own, lo, hi, True))
            continue
        mid = (lo + hi) // 2
        search.exact(mid)
        yield
        for a, b in ((lo, mid), (mid, hi)):
            if b - a > 1:
                heapq.heappush(heap, (key, a, b, False))

    attained, argmax = search.best
    return SuffixMaximum(max(attained, accepted), attained, argmax, len(search.values))
