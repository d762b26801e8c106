"""All the epsilons of one DP-SGD configuration, side by side."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.analysis.composition import (
    DEFAULT_DISCRETIZATION,
    full_batch_epsilon_for_history,
    standard_epsilon_for_history,
)
from opacus_lastiterate.analysis.heuristic import heuristic_epsilon_for_history
from opacus_lastiterate.analysis.history import HistoryLike, TrainingSegment, as_segments

__all__ = ["EpsilonComparison", "compare_epsilons", "compare_epsilons_for_history"]


@dataclass(frozen=True)
class EpsilonComparison:
    """Epsilons at one delta; each field's meaning is in ``LABELS``."""

    delta: float
    steps: int
    heuristic: float
    robust_heuristic: float
    standard: float
    full_batch: float
    standard_discretization: float = DEFAULT_DISCRETIZATION

    LABELS: ClassVar[dict[str, str]] = {
        "heuristic": "last-iterate heuristic (final model only; exact for linear losses, "
        "not a proven bound for deep networks)",
        "robust_heuristic": "robust heuristic: max over the last t <= T steps",
        "standard": "standard composition (all iterates released): dp_accounting PLD, "
        "pessimistic upper bound",
        "full_batch": "full-batch DP-GD with the same expected step and noise (closed form)",
    }

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def compare_epsilons_for_history(
    history: HistoryLike,
    delta: float,
    *,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> EpsilonComparison:
    """Heuristic, robust heuristic, standard and full-batch epsilon of one history."""
    segments = as_segments(history)
    d = check_delta(delta)
    return EpsilonComparison(
        delta=d,
        steps=sum(s.steps for s in segments),
        heuristic=heuristic_epsilon_for_history(segments, d),
        robust_heuristic=heuristic_epsilon_for_history(segments, d, robust=True),
        standard=standard_epsilon_for_history(
            segments, d, value_discretization_interval=value_discretization_interval
        ),
        full_batch=full_batch_epsilon_for_history(segments, d),
        standard_discretization=value_discretization_interval,
    )


def compare_epsilons(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> EpsilonComparison:
    """:func:`compare_epsilons_for_history` for T steps at constant (q, sigma)."""
    return compare_epsilons_for_history(
        (TrainingSegment(noise_multiplier, sample_rate, steps),),
        delta,
        value_discretization_interval=value_discretization_interval,
    )
