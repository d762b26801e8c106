"""Certified maximum over t of the heuristic epsilon of the last t steps.

For a history of segments (sigma_i, q_i, T_i), oldest first, the last t steps give the pair

    P_t = C_t + N(0, s_t^2)   against   Q_t = N(0, s_t^2),

with C_t the Poisson-binomial count of those steps and s_t^2 the sum of their T_i sigma_i^2;
eps_t is its epsilon at the target delta (:mod:`.heuristic`). The robust heuristic is
max_{1 <= t <= T} eps_t, the value a regulariser that zeroes the model would expose
("The Last Iterate Advantage", arXiv 2410.06186). :func:`certified_suffix_maximum` returns a value ``attained`` that is
some eps_t and an upper bound ``epsilon`` on every eps_t, with
``epsilon <= attained * (1 + rtol)``. The upper bound is proved, not searched for.

The bound. Fix a segment j and let t = L + k run over 1 <= k <= T_j, where L counts the
steps of the segments after j. For k1 <= k <= k2,

    eps_k <= eps of the pair (C_{k2} + N(0, s_{k1}^2), N(0, s_{k1}^2)).          (*)

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
   Apply it with X = C_k (the later count plus Binomial(k, q_j)) and X' = C_{k2} (the same
   plus Binomial(k2, q_j)): adding Bernoulli draws only moves the count up.

Since every delta_k(eps) <= delta^(*)(eps), every eps_k(delta) <= eps^(*)(delta). The bound
pair is a :class:`ShiftedGaussianMixture` like the exact ones, evaluated by the same
engine, and bounds over sub-intervals are never larger (the same two steps), so a child
interval may keep its parent's bound until it is needed. Relative to eps_k the slack of (*)
is of order (k2 - k1) / k1, so coarse intervals certify wherever eps_t is well below the
maximum and only the neighbourhood of the maximiser is refined.

The search (branch and bound). Per segment, eps_t is evaluated at k = 1, at a geometric grid
of ratio 8 and at k = T_j. The gaps between evaluated points wait in a max-heap keyed by an
upper bound on their interior: their own bound (*) or one inherited from the gap they were
split from. The top gap gets its own bound if it has none yet and is accepted if that bound
is at most ``attained * (1 + rtol)``; otherwise it is split at its midpoint, which is
evaluated. Interiors of one or two steps are evaluated outright. The search stops when the
top key is certified; ``epsilon`` is the maximum of ``attained``, the accepted bounds and
that key.

Numerics. The float variance of a bound pair is never above that of a pair it bounds (the
same positive terms summed in the same order, one of them smaller). Every bound is padded by
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
from collections import defaultdict
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.last_iterate.canary_count import poisson_binomial_count
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair
from opacus_lastiterate.analysis.run import TrainingSegment, suffix, total_steps

__all__ = [
    "SuffixMaximum",
    "certified_suffix_maximum",
    "suffix_maximum_search",
]

_REL_PAD = 1e-12  # safety margin on every bound for the root finder of the engine: relative
_ABS_PAD = 1e-14  # and absolute (eps near 0); the acceptance target allows 2 * _ABS_PAD
_GRID_RATIO = 8  # initial grid per segment: k = 1, 8, 64, ..., T_j
_EXHAUSTIVE_INTERIOR = 2  # interiors of at most this many steps are evaluated outright


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


def _pair_epsilon(
    counted: Sequence[TrainingSegment], noise: Sequence[TrainingSegment], delta: float
) -> float:
    """Epsilon of the pair with the count of ``counted`` and the noise variance of ``noise``:
    the construction (and floating-point order) of :func:`.heuristic_pair.segments_pair` when
    they agree.
    No steps: 0 (P == Q); steps without noise: inf (the count is seen exactly)."""
    steps_by_rate: dict[float, int] = defaultdict(int)
    for seg in counted:
        steps_by_rate[seg.sample_rate] += seg.steps
    variance = 0.0
    for seg in noise:
        variance += seg.steps * seg.noise_multiplier**2
    if variance == 0.0:
        return math.inf if any(n > 0 for n in steps_by_rate.values()) else 0.0
    count = poisson_binomial_count([(n, q) for q, n in sorted(steps_by_rate.items())])
    return count_pair(count, variance).epsilon(delta)


class _Search:
    """Exact eps_t (cached) and the bound (*) on the interior of an interval (lo, hi)."""

    def __init__(self, segments: tuple[TrainingSegment, ...], delta: float) -> None:
        self._segments = segments
        self._delta = delta
        self.values: dict[int, float] = {}
        self.best = (-math.inf, 0)  # (largest eps_t, its t); ties go to the larger t

    def exact(self, t: int) -> None:
        if t not in self.values:
            part = suffix(self._segments, t)
            value = _pair_epsilon(part, part, self._delta)
            self.values[t] = value
            self.best = max(self.best, (value, t))

    def bound(self, lo: int, hi: int) -> float:
        """Upper bound on eps_t for lo < t < hi (one segment): count of hi - 1 steps, noise
        of lo + 1 steps; the float variance is monotone in t, so this stays sound."""
        eps = _pair_epsilon(
            suffix(self._segments, hi - 1), suffix(self._segments, lo + 1), self._delta
        )
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

    # Gaps (lo, hi) between evaluated points of one segment's range with a non-empty interior.
    gaps: list[tuple[int, int]] = []
    later = 0
    for seg in reversed(segments):
        if seg.steps == 0:
            continue
        grid = _segment_grid(later, seg.steps)
        for t in grid:
            search.exact(t)
            yield
        gaps += [(a, b) for a, b in itertools.pairwise(grid) if b - a > 1]
        later += seg.steps

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
