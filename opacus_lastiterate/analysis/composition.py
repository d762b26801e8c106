"""Baselines printed beside the heuristic (``last-iterate.md``, "Baselines").

* Standard composition (every intermediate model released): the Poisson-subsampled Gaussian
  mechanism composed over the history, with Google's ``dp_accounting`` PLD accountant
  (add/remove neighbours, pessimistic discretisation of the privacy loss with interval
  ``value_discretization_interval``). The result is an upper bound on the exact value.
* Full-batch DP-GD with the same expected step and noise variance: q = 1 and noise
  multiplier sigma / q for each step, i.e. mu-GDP with mu^2 = sum_t (q_t / sigma_t)^2,
  in closed form.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from opacus_lastiterate.analysis._validation import check_delta, check_positive
from opacus_lastiterate.analysis.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.analysis.history import HistoryLike, TrainingSegment, as_segments

if TYPE_CHECKING:
    from dp_accounting import dp_event

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "full_batch_epsilon",
    "full_batch_epsilon_for_history",
    "standard_epsilon",
    "standard_epsilon_for_history",
]

DEFAULT_DISCRETIZATION = 1e-4
"""Default ``value_discretization_interval`` of the PLD accountant (dp_accounting's own)."""


def _dp_sgd_event(segments: tuple[TrainingSegment, ...]) -> dp_event.DpEvent:
    from dp_accounting import dp_event

    return dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(
                dp_event.PoissonSampledDpEvent(
                    s.sample_rate, dp_event.GaussianDpEvent(s.noise_multiplier)
                ),
                s.steps,
            )
            for s in segments
            if s.steps > 0
        ]
    )


def standard_epsilon_for_history(
    history: HistoryLike,
    delta: float,
    *,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Composition epsilon of DP-SGD (all iterates released): dp_accounting PLD upper bound."""
    segments = as_segments(history)
    d = check_delta(delta)
    interval = check_positive("value_discretization_interval", value_discretization_interval)
    if all(s.steps == 0 for s in segments):
        return 0.0
    import dp_accounting  # deferred: importing it (and scipy.signal, scipy.stats) costs ~0.7 s

    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=interval,
    )
    return float(accountant.compose(_dp_sgd_event(segments)).get_epsilon(d))


def standard_epsilon(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Composition epsilon for T = ``steps`` steps at constant (q, sigma)."""
    return standard_epsilon_for_history(
        (TrainingSegment(noise_multiplier, sample_rate, steps),),
        delta,
        value_discretization_interval=value_discretization_interval,
    )


def full_batch_epsilon_for_history(history: HistoryLike, delta: float) -> float:
    """Full-batch DP-GD baseline: mu-GDP with mu^2 = sum_t (q_t / sigma_t)^2 (closed form)."""
    segments = as_segments(history)
    d = check_delta(delta)
    mu2 = sum(s.steps * (s.sample_rate / s.noise_multiplier) ** 2 for s in segments)
    return 0.0 if mu2 == 0.0 else gaussian_epsilon(d, mu=math.sqrt(mu2))


def full_batch_epsilon(
    delta: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """Full-batch baseline for T steps: mu = q sqrt(T) / sigma."""
    return full_batch_epsilon_for_history(
        (TrainingSegment(noise_multiplier, sample_rate, steps),), delta
    )
