"""The last-iterate heuristic of Steinke et al. (ICLR 2025).

For linear losses the final model of T steps of DP-SGD (Poisson rate q, noise multiplier
sigma, add/remove neighbours) is exactly as private as distinguishing

    P = Binomial(T, q) + N(0, sigma^2 T)   from   Q = N(0, sigma^2 T),
    delta(eps) = max(H_{e^eps}(P, Q), H_{e^eps}(Q, P))          (``last-iterate.md``).

For a history of segments (sigma_i, q_i, T_i) at a constant learning rate the count is the
Poisson-binomial sum of Binomial(T_i, q_i) and the noise variance is sum_i T_i sigma_i^2.

The number is exact for linear losses and a *heuristic* for real networks: it is not a
proven differential-privacy guarantee for deep models, and it describes the release of the
final model only. ``robust=True`` returns max over the last t <= T steps, the value a
regulariser that zeroes the model would expose (``last-iterate.md``, "Robust variant"), as a
certified upper bound (:mod:`.suffix_maximum`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta, check_epsilon
from opacus_lastiterate.analysis.canary_count import poisson_binomial_count
from opacus_lastiterate.analysis.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.history import (
    HistoryLike,
    TrainingSegment,
    as_segments,
    suffix,
    total_steps,
)

__all__ = [
    "heuristic_delta",
    "heuristic_delta_for_history",
    "heuristic_epsilon",
    "heuristic_epsilon_for_history",
    "heuristic_pair",
]

# robust=True: every t up to this many steps, then a geometric grid with local refinement.
_EXHAUSTIVE_STEPS = 1024
_GRID_RATIO = 1.01


@lru_cache(maxsize=512)
def _pair(segments: tuple[TrainingSegment, ...]) -> ShiftedGaussianMixture | None:
    steps_by_rate: dict[float, int] = defaultdict(int)
    variance = 0.0
    for seg in segments:
        steps_by_rate[seg.sample_rate] += seg.steps
        variance += seg.steps * seg.noise_multiplier**2
    if variance == 0.0:
        return None  # no steps: P == Q
    count = poisson_binomial_count([(n, q) for q, n in sorted(steps_by_rate.items())])
    return ShiftedGaussianMixture(
        count.support.astype(float), count.log_pmf, math.sqrt(variance), count.dropped_mass
    )


def heuristic_pair(history: HistoryLike) -> ShiftedGaussianMixture | None:
    """The (P, Q) pair of the heuristic for a history, or None for an empty history."""
    return _pair(as_segments(history))


def _segment(steps: object, sample_rate: object, noise_multiplier: object) -> tuple[TrainingSegment, ...]:
    return (TrainingSegment(noise_multiplier, sample_rate, steps),)  # type: ignore[arg-type]


def _epsilon(segments: tuple[TrainingSegment, ...], delta: float) -> float:
    pair = _pair(segments)
    return 0.0 if pair is None else pair.epsilon(delta)


def suffix_epsilons(segments: tuple[TrainingSegment, ...], delta: float) -> dict[int, float]:
    """Heuristic epsilon of the last t steps, for the t that locate max_{t <= T} eps_t.

    Every t <= 1024 is evaluated (exact); beyond, a geometric grid of ratio 1.01 up to T and
    an integer search between the grid neighbours of the best grid point. Returns
    ``{t: eps_t}`` for every t evaluated (T always included; empty for an empty history).
    Not certified (it can miss peaks between grid points); ``robust=True`` uses
    :func:`.suffix_maximum.certified_suffix_maximum` instead.
    """
    n = total_steps(segments)
    cache: dict[int, float] = {}
    if n == 0:
        return cache

    def eps_at(t: int) -> float:
        if t not in cache:
            cache[t] = _epsilon(suffix(segments, t), delta)
        return cache[t]

    ts = list(range(1, min(n, _EXHAUSTIVE_STEPS) + 1))
    if n > _EXHAUSTIVE_STEPS:
        k = math.ceil(math.log(n / _EXHAUSTIVE_STEPS) / math.log(_GRID_RATIO))
        grid = np.unique(np.round(_EXHAUSTIVE_STEPS * _GRID_RATIO ** np.arange(1, k + 1)).astype(int))
        ts += [int(t) for t in grid if t < n] + [n]
    values = [eps_at(t) for t in ts]
    i = int(np.argmax(values))
    if ts[i] > _EXHAUSTIVE_STEPS and 0 < i < len(ts) - 1:
        lo, hi = ts[i - 1], ts[i + 1]
        while hi - lo > 32:  # ternary search on integers, then exhaustive
            m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
            if eps_at(m1) < eps_at(m2):
                lo = m1
            else:
                hi = m2
        for t in range(lo, hi + 1):
            eps_at(t)
    return cache


def _robust_epsilon(segments: tuple[TrainingSegment, ...], delta: float) -> float:
    """Certified upper bound on max over t <= T of the heuristic epsilon of the last t steps,
    within a relative 1e-6 of an attained eps_t (:mod:`.suffix_maximum`)."""
    from opacus_lastiterate.analysis.suffix_maximum import certified_suffix_maximum

    return certified_suffix_maximum(segments, delta).epsilon


def heuristic_epsilon_for_history(
    history: HistoryLike, delta: float, *, robust: bool = False
) -> float:
    """Heuristic epsilon of the final model after ``history`` (Opacus triples or segments).

    Args:
        history: ``(noise_multiplier, sample_rate, steps)`` segments, oldest first.
        delta: target delta in (0, 1).
        robust: return the max over the last t <= T steps instead (a certified upper bound,
            within a relative 1e-6 of an attained value).

    Returns:
        eps >= 0 with delta(eps) <= ``delta`` for the heuristic pair; ``inf`` only if the
        truncated tail mass (< 1e-32) exceeds ``delta``.
    """
    segments = as_segments(history)
    d = check_delta(delta)
    return _robust_epsilon(segments, d) if robust else _epsilon(segments, d)


def heuristic_delta_for_history(history: HistoryLike, epsilon: float) -> float:
    """Heuristic delta(eps) of the final model after ``history`` (an upper bound on the
    exact value of the pair; the truncated tail mass is added)."""
    segments = as_segments(history)
    eps = check_epsilon(epsilon)
    pair = _pair(segments)
    return 0.0 if pair is None else pair.delta(eps)


def heuristic_epsilon(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    robust: bool = False,
) -> float:
    """Heuristic epsilon for T = ``steps`` steps at constant (q, sigma); see module docs."""
    d = check_delta(delta)
    segments = _segment(steps, sample_rate, noise_multiplier)
    return _robust_epsilon(segments, d) if robust else _epsilon(segments, d)


def heuristic_delta(
    epsilon: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """Heuristic delta(eps) for T = ``steps`` steps at constant (q, sigma)."""
    return heuristic_delta_for_history(_segment(steps, sample_rate, noise_multiplier), epsilon)
