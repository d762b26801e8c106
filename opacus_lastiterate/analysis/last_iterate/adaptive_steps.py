"""One recorded step of an adaptive optimiser, and the weights of a run of them.

An accountant that follows an adaptive optimiser (Adam, AdamW, NAdam, RAdam, Adamax,
RMSprop, Adagrad) records, per step, the optimiser's :class:`~.adaptive_weights.AdaptiveSettings`
together with the standard deviation of the noise on one coordinate of the gradient the
optimiser sees (sigma_t C / B for Opacus's averaged noisy gradient): the two things the
frozen-second-moment weights of :func:`~.adaptive_weights.adaptive_weights` are made of.
:class:`AdaptiveStep` is that record; :func:`adaptive_run_weights` turns a run-length list
of them into the weights w_t of the final model (``docs/adaptive_optimizers.md``), and
:func:`adaptive_run_caveats` gives the sentences of
:func:`~.adaptive_regime.adaptive_heuristic_caveats` for the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.last_iterate.adaptive_regime import adaptive_heuristic_caveats
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    AdaptiveSettings,
    adaptive_weights,
)

__all__ = ["ADAPTIVE_STEP_FIELDS", "AdaptiveStep", "adaptive_run_caveats", "adaptive_run_weights"]

ADAPTIVE_STEP_FIELDS: tuple[str, ...] = (
    "optimizer", "lr", "beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay",
    "amsgrad", "centered", "lr_decay", "initial_accumulator_value", "momentum_decay",
    "noise_std",
)  # fmt: skip
"""The fields of :meth:`AdaptiveStep.as_tuple`, in order (the settings', then noise_std)."""


@dataclass(frozen=True)
class AdaptiveStep:
    """The settings of one step of an adaptive optimiser and the noise it saw.

    Attributes:
        settings: the optimiser's hyperparameters at this step.
        noise_std: s_t > 0, the standard deviation of the noise on one coordinate of the
            gradient the optimiser sees (sigma_t C / B under Opacus).
    """

    settings: AdaptiveSettings
    noise_std: float

    def __post_init__(self) -> None:
        if not isinstance(self.settings, AdaptiveSettings):
            raise TypeError(
                f"`settings` must be an AdaptiveSettings, got {type(self.settings).__name__}."
            )
        std = check_in_interval("noise_std", self.noise_std, 0.0, math.inf)
        object.__setattr__(self, "noise_std", std)

    @classmethod
    def from_tuple(cls, values: Sequence[object]) -> AdaptiveStep:
        """The step of :meth:`as_tuple`'s values (validated as the constructors do)."""
        *fields, noise_std = values
        return cls(AdaptiveSettings(*fields), noise_std)  # type: ignore[arg-type]

    def as_tuple(self) -> tuple[object, ...]:
        """The values of :data:`ADAPTIVE_STEP_FIELDS`, in order."""
        return (*self.settings.as_tuple(), self.noise_std)


def _per_step(runs: Sequence[tuple[AdaptiveStep, int]]) -> tuple[list[AdaptiveSettings], np.ndarray]:
    settings: list[AdaptiveSettings] = []
    for step, n in runs:
        settings.extend([step.settings] * int(n))
    noise = np.repeat([step.noise_std for step, _ in runs], [int(n) for _, n in runs])
    return settings, noise


def adaptive_run_weights(runs: Sequence[tuple[AdaptiveStep, int]]) -> np.ndarray:
    """The weights w_1..w_T of a run given as (step, number of steps) pairs, oldest first:
    :func:`~.adaptive_weights.adaptive_weights` of the per-step settings and noise."""
    settings, noise = _per_step(runs)
    return adaptive_weights(settings, noise_std=noise)


def adaptive_run_caveats(
    runs: Sequence[tuple[AdaptiveStep, int]],
    noise_multipliers: Sequence[float] | np.ndarray,
    sample_rates: Sequence[float] | np.ndarray,
) -> tuple[str, ...]:
    """The caveats (:func:`~.adaptive_regime.adaptive_heuristic_caveats`) of a recorded run:
    its largest sample rate, smallest noise multiplier (> 0), extreme betas and largest
    eps / noise_std. ``()`` for an empty run."""
    if not runs:
        return ()
    steps = [step for step, _ in runs]
    sigma = np.asarray(noise_multipliers, dtype=float)
    positive = sigma[sigma > 0]
    if positive.size == 0:
        return ()
    beta1 = [s.settings.beta1 for s in steps]
    beta2 = [s.settings.beta2 for s in steps]
    extreme_b1 = max(beta1) if max(beta1) > 0.9 else min(beta1)
    extreme_b2 = max(beta2) if max(beta2) > 0.999 else min(beta2)
    return adaptive_heuristic_caveats(
        steps[0].settings.optimizer,
        sample_rate=float(np.max(sample_rates)),
        noise_multiplier=float(positive.min()),
        steps=int(sum(n for _, n in runs)),
        beta1=extreme_b1,
        beta2=extreme_b2,
        eps_over_noise=max(s.settings.eps / s.noise_std for s in steps),
    )
