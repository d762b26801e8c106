"""The pair of the last-iterate heuristic at a constant learning rate, and its epsilon and delta.

For a history of segments (sigma_i, q_i, T_i) the canary count K is the Poisson-binomial sum
of Binomial(T_i, q_i), the noise variance is sum_i T_i sigma_i^2, and the heuristic pair is

    P = K + N(0, variance)   against   Q = N(0, variance)

(:mod:`.heuristic`; ``docs/last_iterate.md``, "Statement and threat model").

This is the engine that :mod:`.heuristic` (the privacy models), :mod:`.suffix_maximum` (the
robust maximum), :mod:`.weighted_heuristic` (its constant-weights path), :mod:`.incremental`
and :mod:`.budget_horizon` share. It imports none of them, so each imports it downward.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

import numpy as np

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    CountDistribution,
    poisson_binomial_count,
)
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.run import TrainingSegment

__all__ = [
    "segments_pair",
]


def count_pair(count: CountDistribution, variance: float) -> ShiftedGaussianMixture:
    """The heuristic pair for a canary count K: P = K + N(0, variance), Q = N(0, variance)."""
    return ShiftedGaussianMixture._trusted(
        np.arange(count.offset, count.offset + count.log_pmf.size, dtype=float),
        count.log_pmf,
        math.sqrt(variance),
        count.dropped_mass,
    )


@lru_cache(maxsize=512)
def segments_pair(segments: tuple[TrainingSegment, ...]) -> ShiftedGaussianMixture | None:
    """The pair of validated segments (cached); None when there is no noise variance (no
    steps: P == Q)."""
    steps_by_rate: dict[float, int] = defaultdict(int)
    variance = 0.0
    for seg in segments:
        steps_by_rate[seg.sample_rate] += seg.steps
        variance += seg.steps * seg.noise_multiplier**2
    if variance == 0.0:
        return None  # no steps: P == Q
    count = poisson_binomial_count([(n, q) for q, n in sorted(steps_by_rate.items())])
    return count_pair(count, variance)


def has_noiseless_step(segments: tuple[TrainingSegment, ...]) -> bool:
    """Some step was released without noise (``docs/run_description.md``, "Zero noise"):
    epsilon = inf. Under a linear loss the other steps' noise would still hide its count,
    but a regulariser that zeroes the model before that step exposes it (robust variant),
    so the heuristic does not credit other steps' noise to it."""
    return any(s.steps and s.noise_multiplier == 0.0 for s in segments)


def segments_epsilon(segments: tuple[TrainingSegment, ...], delta: float) -> float:
    """Heuristic epsilon of validated segments at a validated ``delta`` (never below the
    exact epsilon of the pair)."""
    if has_noiseless_step(segments):
        return math.inf
    pair = segments_pair(segments)
    return 0.0 if pair is None else pair.epsilon(delta)


def segments_delta(segments: tuple[TrainingSegment, ...], epsilon: float) -> float:
    """Heuristic delta of validated segments at a validated ``epsilon`` (an upper bound on
    the exact delta of the pair)."""
    if has_noiseless_step(segments):
        return 1.0
    pair = segments_pair(segments)
    return 0.0 if pair is None else pair.delta(epsilon)
