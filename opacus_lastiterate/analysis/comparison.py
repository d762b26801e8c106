"""All the epsilons of one DP-SGD configuration, side by side."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from opacus_lastiterate.analysis._validation import check_delta, check_noise_multiplier
from opacus_lastiterate.analysis.baselines.composition import (
    DEFAULT_DISCRETIZATION,
    FullBatchGaussian,
    StandardComposition,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run

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
    history: RunLike,
    delta: float,
    *,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> EpsilonComparison:
    """Heuristic, robust heuristic, standard and full-batch epsilon of one run (a
    :class:`~.run.DPSGDRun` or an Opacus-style history), validated once."""
    run = as_run(history, "history")
    d = check_delta(delta)
    return EpsilonComparison(
        delta=d,
        steps=run.num_steps,
        heuristic=LastIterateHeuristic(run).epsilon(d),
        robust_heuristic=RobustLastIterateHeuristic(run).epsilon(d),
        standard=StandardComposition(
            run, value_discretization_interval=value_discretization_interval
        ).epsilon(d),
        full_batch=FullBatchGaussian(run).epsilon(d),
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
    """:func:`compare_epsilons_for_history` for T steps at constant (q, sigma > 0)."""
    sigma = check_noise_multiplier(noise_multiplier)
    return compare_epsilons_for_history(
        DPSGDRun.constant(steps=steps, sample_rate=sample_rate, noise_multiplier=sigma),
        delta,
        value_discretization_interval=value_discretization_interval,
    )
