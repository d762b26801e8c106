"""The function-style delta twins of the epsilon functions, the weighted model's results and
the discretisation method keyword."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from opacus_lastiterate.analysis.baselines.composition import (
    full_batch_delta,
    standard_delta,
    standard_epsilon,
    standard_rdp_delta,
    standard_rdp_epsilon,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_delta_result,
    weighted_heuristic_epsilon_result,
)
from opacus_lastiterate.analysis.normalisation import asgm_epsilon
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

KW = {"steps": 12, "sample_rate": 0.1, "noise_multiplier": 1.3}


def _gaussian_delta(eps: float, mu: float) -> float:
    """delta of mu-GDP, written out with scipy (independent of gaussian_mechanism)."""
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))


def test_delta_twins_against_closed_forms() -> None:
    # q = 1: the heuristic pair is N(T, sigma^2 T) against N(0, sigma^2 T), mu = sqrt(T)/sigma
    full = {"steps": 9, "sample_rate": 1.0, "noise_multiplier": 2.0}
    assert privacy_model("heuristic", DPSGDRun.constant(**full)).delta(1.0) == pytest.approx(_gaussian_delta(1.0, 1.5), rel=1e-9)
    mu = 0.1 * math.sqrt(12) / 1.3
    assert full_batch_delta(0.7, **KW) == pytest.approx(_gaussian_delta(0.7, mu), rel=1e-9)


def test_delta_twins_invert_the_epsilon_functions() -> None:
    for name, rel in [("heuristic", 1e-9), ("robust_heuristic", 1e-5)]:
        model = privacy_model(name, DPSGDRun.constant(**KW))
        assert model.delta(model.epsilon(1e-6)) == pytest.approx(1e-6, rel=rel), name
    for eps_fn, delta_fn, rel in [
        (standard_epsilon, standard_delta, 1e-6),
        (standard_rdp_epsilon, standard_rdp_delta, 1e-9),
    ]:
        eps = eps_fn(1e-6, **KW)
        assert delta_fn(eps, **KW) == pytest.approx(1e-6, rel=rel), eps_fn.__name__


def test_weighted_model_results_are_the_registry_numbers() -> None:
    run = DPSGDRun.from_history([(1.0, 0.2, 4)], weights=[1.0, 0.5, 0.25, 2.0])
    model = privacy_model("heuristic", run)
    assert model.epsilon_result(1e-5).value == model.epsilon(1e-5)  # type: ignore[attr-defined]
    assert model.delta_result(1.0).value == model.delta(1.0)  # type: ignore[attr-defined]
    assert weighted_heuristic_epsilon_result(
        1e-5, weights=run.weights, sample_rates=0.2, noise_multipliers=1.0
    ).value == model.epsilon(1e-5)
    assert weighted_heuristic_delta_result(
        1.0, weights=run.weights, sample_rates=0.2, noise_multipliers=1.0
    ).value == model.delta(1.0)
    with pytest.raises(ValueError, match="no per-step weights"):
        privacy_model("heuristic", DPSGDRun.constant(**KW)).epsilon_result(1e-5)  # type: ignore[attr-defined]


def test_discretization_method_keyword() -> None:
    kw = {"dataset_size": 50, "sample_rate": 0.1, "noise_multiplier": 1.0, "steps": 2,
          "value_discretization_interval": 1e-3}
    round_up = asgm_epsilon(1e-5, discretization_method="round_up", **kw)
    connect_dots = asgm_epsilon(1e-5, **kw)
    assert round_up != connect_dots
    with pytest.raises(TypeError, match="discretisation"):
        asgm_epsilon(1e-5, discretisation="round_up", **kw)  # type: ignore[call-arg]
