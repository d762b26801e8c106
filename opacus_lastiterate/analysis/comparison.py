"""All the epsilons of one DP-SGD configuration, side by side: the models
:data:`COMPARED_MODELS` of the registry (:mod:`~.privacy_models`), built there."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from opacus_lastiterate.analysis._validation import check_delta, check_noise_multiplier
from opacus_lastiterate.analysis.baselines.composition import DEFAULT_DISCRETIZATION
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_models import PRIVACY_MODELS, privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run

__all__ = [
    "EpsilonComparison",
    "compare_epsilons",
    "compare_epsilons_for_history",
]

COMPARED_MODELS: tuple[str, ...] = ("heuristic", "robust_heuristic", "standard", "full_batch")
"""The registry names compared, in order: the fields of :class:`EpsilonComparison`."""


def compared_models(
    run: DPSGDRun, *, value_discretization_interval: float = DEFAULT_DISCRETIZATION
) -> dict[str, PrivacyModel]:
    """The models of :data:`COMPARED_MODELS` for ``run``, by registry name (the standard one
    with PLD interval ``value_discretization_interval``)."""
    params = {"standard": {"value_discretization_interval": value_discretization_interval}}
    return {name: privacy_model(name, run, **params.get(name, {})) for name in COMPARED_MODELS}


@dataclass(frozen=True)
class EpsilonComparison:
    """Epsilons at one delta; each field's meaning is in ``LABELS`` (the registry's
    descriptions). ``standard_discretization`` is the ``value_discretization_interval`` of
    the standard model (the field keeps its name: it is a key of the CLI's JSON)."""

    delta: float
    steps: int
    heuristic: float
    robust_heuristic: float
    standard: float
    full_batch: float
    standard_discretization: float = DEFAULT_DISCRETIZATION

    LABELS: ClassVar[dict[str, str]] = {
        name: PRIVACY_MODELS[name].description for name in COMPARED_MODELS
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
    models = compared_models(run, value_discretization_interval=value_discretization_interval)
    return EpsilonComparison(
        delta=d,
        steps=run.num_steps,
        **{name: model.epsilon(d) for name, model in models.items()},  # type: ignore[arg-type]
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
