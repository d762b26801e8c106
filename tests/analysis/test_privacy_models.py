"""The privacy-model objects: one query shape, checked against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.baselines.composition import FullBatchGaussian, StandardComposition
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_delta
from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.normalisation.asgm import ASGM, asgm_epsilon
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, Normalisation

CASES = [(20, 0.1, 1.0), (200, 0.02, 0.8), (3, 0.5, 2.0)]


def _beta_reference(alpha: float, steps: int, q: float, sigma: float) -> float:
    """Pr_P[Y < tau] with tau the (1 - alpha) quantile of Q, summed over the full binomial."""
    s = sigma * math.sqrt(steps)
    tau = stats.norm.isf(alpha, scale=s)
    k = np.arange(steps + 1)
    return float(np.sum(stats.binom.pmf(k, steps, q) * stats.norm.cdf((tau - k) / s)))


@pytest.mark.parametrize("steps,q,sigma", CASES)
def test_heuristic_beta_equals_a_direct_binomial_sum(steps: int, q: float, sigma: float) -> None:
    model = LastIterateHeuristic(DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma))
    for alpha in (1e-6, 1e-3, 0.05, 0.3, 0.9):
        assert model.beta(alpha) == pytest.approx(_beta_reference(alpha, steps, q, sigma), rel=1e-9)
    assert model.beta(0.0) == pytest.approx(1.0) and model.beta(1.0) == 0.0


@pytest.mark.parametrize("steps,q,sigma", CASES)
def test_trade_off_curve_and_privacy_profile_agree(steps: int, q: float, sigma: float) -> None:
    """H_{e^eps}(P, Q) = sup_alpha 1 - beta(alpha) - e^eps alpha <= delta(eps) (both directions),
    with equality up to the alpha grid when P||Q is the larger direction."""
    model = LastIterateHeuristic(DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma))
    alphas = np.geomspace(1e-12, 0.999, 4000)
    betas = np.array([model.beta(a) for a in alphas])
    for eps in (0.0, 0.5, 1.0, 2.0):
        sup = float(np.max(1.0 - betas - math.exp(eps) * alphas))
        delta = model.delta(eps)
        assert sup <= delta + 1e-12
        assert sup >= 0.97 * delta - 1e-9  # the grid misses at most a few percent


def test_full_batch_matches_closed_forms() -> None:
    run = DPSGDRun.from_history([(1.0, 0.1, 50), (2.0, 0.2, 10)])
    model = FullBatchGaussian(run)
    mu = math.sqrt(50 * 0.1**2 + 10 * 0.1**2)
    assert model.mu == pytest.approx(mu, rel=1e-12)
    assert model.delta(1.0) == pytest.approx(gaussian_delta(mu=mu, epsilon=1.0), rel=1e-12)
    assert model.delta(model.epsilon(1e-5)) == pytest.approx(1e-5, rel=1e-6)
    alpha = 0.01
    assert model.beta(alpha) == pytest.approx(stats.norm.cdf(stats.norm.isf(alpha) - mu), rel=1e-10)


def test_standard_composition_is_consistent_and_above_the_heuristic() -> None:
    run = DPSGDRun.constant(steps=100, sample_rate=0.05, noise_multiplier=1.0)
    standard = StandardComposition(run)
    eps = standard.epsilon(1e-5)
    assert standard.delta(eps) <= 1e-5 * (1 + 1e-6)
    assert LastIterateHeuristic(run).epsilon(1e-5) < eps


def test_robust_model_is_at_least_the_plain_value_and_inverts() -> None:
    run = DPSGDRun.constant(steps=300, sample_rate=0.05, noise_multiplier=0.6)
    plain, robust = LastIterateHeuristic(run), RobustLastIterateHeuristic(run)
    eps = robust.epsilon(1e-6)
    assert eps >= plain.epsilon(1e-6)
    assert eps >= privacy_model("heuristic", DPSGDRun.constant(steps=1, sample_rate=0.05, noise_multiplier=0.6)).epsilon(1e-6)
    delta = robust.delta(eps)
    assert delta == pytest.approx(1e-6, rel=1e-5) and delta >= plain.delta(eps)


def test_asgm_model_equals_the_convenience_function() -> None:
    run = DPSGDRun.from_history(
        [(2.0, 0.1, 10)], normalisation=Normalisation("realised", dataset_size=8)
    )
    expected = asgm_epsilon(1e-5, dataset_size=8, sample_rate=0.1, noise_multiplier=2.0, steps=10)
    assert ASGM(run).epsilon(1e-5) == expected
    assert ASGM(run).delta(ASGM(run).epsilon(1e-5)) <= 1e-5 * (1 + 1e-6)
    with pytest.raises(ValueError, match="dataset_size"):
        ASGM(DPSGDRun.constant(steps=2, sample_rate=0.1, noise_multiplier=1.0))


@pytest.mark.parametrize(
    "model",
    [LastIterateHeuristic, RobustLastIterateHeuristic, StandardComposition, FullBatchGaussian],
)
def test_no_noise_means_infinite_epsilon_and_delta_one(model: type) -> None:
    run = DPSGDRun.from_history([(0.0, 0.1, 5)])
    assert model(run).epsilon(1e-5) == math.inf
    assert model(run).delta(10.0) == 1.0


@pytest.mark.parametrize(
    "model",
    [LastIterateHeuristic, RobustLastIterateHeuristic, StandardComposition, FullBatchGaussian],
)
def test_empty_run_and_bad_arguments(model: type) -> None:
    empty = model(DPSGDRun.from_history([]))
    assert empty.epsilon(1e-5) == 0.0 and empty.delta(1.0) == 0.0
    run = model(DPSGDRun.constant(steps=3, sample_rate=0.1, noise_multiplier=1.0))
    with pytest.raises(ValueError, match="`delta`"):
        run.epsilon(0.0)
    with pytest.raises(ValueError, match="`epsilon`"):
        run.delta(-1.0)
