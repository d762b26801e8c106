"""Public behaviour of the Poisson heuristic that mutation testing found unasserted
(``docs/testing.md``, "Mutation testing"): delta(epsilon) of the free functions, the robust
delta's bisection, the weighted route of :class:`LastIterateHeuristic`, the trade-off curve
``beta``, and the messages of refused inputs. Every expected value is computed here from the
definition (binomial enumeration, 2^T inclusion patterns, normal tails) with scipy, not by
the package."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import segments_delta
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment
from opacus_lastiterate.analysis.sampling import ShuffledBatches
from tests.analysis._reference import ClosedFormMixture, enumerate_weighted_shifts

REL = 1e-6


def _tv_gaussian(mu: float) -> float:
    """delta(0) of N(mu, 1) against N(0, 1): the total variation 2 Phi(mu / 2) - 1."""
    return float(2.0 * stats.norm.cdf(mu / 2.0) - 1.0)


# -- delta(epsilon) of the free functions ------------------------------------------------------


@pytest.mark.parametrize(("T", "q", "sigma"), [(10, 0.1, 1.0), (200, 0.02, 0.8), (1, 1.0, 2.0)])
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0])
def test_heuristic_delta_is_the_binomial_pairs_delta(T, q, sigma, eps) -> None:
    ours = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
    ref = ClosedFormMixture.binomial(T, q, sigma).delta(eps)
    assert ours == pytest.approx(ref, rel=REL, abs=1e-15)
    assert ours >= ref * (1 - 1e-9)  # an upper bound on the exact delta


def test_robust_heuristic_delta_is_the_max_over_suffixes() -> None:
    """Small sigma, where the heuristic is not monotone in T: max_t delta_t(eps) over the
    closed form of each suffix, to the bisection's 1e-6 relative in log delta (rounded up)."""
    T, q, sigma = 30, 0.01, 0.5
    for eps in (0.0, 1.0, 3.0):
        ref = max(ClosedFormMixture.binomial(t, q, sigma).delta(eps) for t in range(1, T + 1))
        ours = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
        assert ref * (1 - 1e-9) <= ours <= ref * (1 + 2e-6)
        assert ours > ClosedFormMixture.binomial(T, q, sigma).delta(eps)


def test_robust_delta_when_every_delta_is_tiny_is_the_bisections_floor() -> None:
    """Above the robust epsilon at delta = 1e-300 (the bisection's lower end) the answer is
    that floor, and each suffix's exact delta lies below it."""
    T, q, sigma = 10, 0.01, 1.0
    eps = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(1e-300) + 1.0
    d = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
    assert d == pytest.approx(1e-300, rel=1e-12)  # exp(log(1e-300)), rounded
    assert max(ClosedFormMixture.binomial(t, q, sigma).delta(eps) for t in range(1, T + 1)) <= d


def test_robust_delta_of_a_near_deterministic_release_stays_a_probability() -> None:
    """q = 1, T = 1, sigma = 1 / (2 z): the Gaussian mechanism with mu = 2 z, whose delta at
    eps = 0 is TV = 1 - 2 Phi(-z), close to 1: the answer lies between TV and 1."""
    z = 6.0
    tv = _tv_gaussian(2 * z)
    d = privacy_model("robust_heuristic", DPSGDRun.constant(steps=1, sample_rate=1.0, noise_multiplier=1 / (2 * z))).delta(0.0)
    assert tv * (1 - 1e-12) <= d <= 1.0
    assert d == pytest.approx(tv, rel=2e-6)


def test_robust_delta_above_the_largest_epsilon_is_one() -> None:
    """mu = 200: the total variation is 1 in double precision, so even the largest delta
    below 1 needs eps > 0; delta(0) is 1."""
    assert _tv_gaussian(200.0) == 1.0
    assert privacy_model("robust_heuristic", DPSGDRun.constant(steps=1, sample_rate=1.0, noise_multiplier=0.005)).delta(0.0) == 1.0
    assert privacy_model("heuristic", DPSGDRun.constant(steps=1, sample_rate=1.0, noise_multiplier=0.005)).delta(0.0) == 1.0


def test_robust_delta_and_epsilon_are_inverse() -> None:
    T, q, sigma = 30, 0.01, 0.5
    eps = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(1e-5)
    back = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
    assert back == pytest.approx(1e-5, rel=1e-5)


# -- the weighted route -------------------------------------------------------------------------

WEIGHTS = [1.0, 0.9, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1]  # a decaying learning rate
RATES = [0.3, 0.1, 0.3, 0.2, 0.3, 0.1, 0.3, 0.2]
SIGMAS = [0.8, 1.2, 1.0, 0.9, 1.1, 1.0, 0.7, 1.3]


def _weighted_reference() -> ClosedFormMixture:
    """All 2^8 inclusion patterns: shifts sum_t b_t w_t, noise s^2 = sum_t w_t^2 sigma_t^2."""
    x, p = enumerate_weighted_shifts(WEIGHTS, RATES)
    s = math.sqrt(sum((w * sg) ** 2 for w, sg in zip(WEIGHTS, SIGMAS, strict=True)))
    return ClosedFormMixture(x, p, s)


def _weighted_run() -> DPSGDRun:
    history = [(sg, q, 1) for sg, q in zip(SIGMAS, RATES, strict=True)]
    return DPSGDRun.from_history(history, weights=WEIGHTS)


@pytest.mark.parametrize("accuracy", [1e-3, 0.05])
def test_weighted_epsilon_and_delta_bound_the_enumerated_pair(accuracy) -> None:
    """Rounded up to within ``accuracy`` relative of the exact pair (never below it)."""
    model = LastIterateHeuristic(_weighted_run(), accuracy=accuracy)
    ref = _weighted_reference()
    for delta in (1e-6, 1e-3):
        exact = ref.epsilon(delta)
        assert exact * (1 - 1e-9) <= model.epsilon(delta) <= exact * (1 + accuracy) + 1e-12
    for eps in (0.5, 2.0):
        exact = ref.delta(eps)
        assert exact * (1 - 1e-9) <= model.delta(eps) <= exact * (1 + accuracy) + 1e-15


def test_weighted_run_has_no_trade_off_curve() -> None:
    with pytest.raises(
        NotImplementedError,
        match=r"^beta\(alpha\) is computed for runs without per-step weights only\.$",
    ):
        LastIterateHeuristic(_weighted_run()).beta(0.1)


def test_robust_model_refuses_weights_naming_run() -> None:
    with pytest.raises(
        ValueError, match=r"^`run` must have no per-step weights: .* constant-rate formula\.$"
    ):
        RobustLastIterateHeuristic(_weighted_run())


# -- the trade-off curve ------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 1e-4, 0.05, 0.5, 1.0])
def test_beta_is_the_neyman_pearson_curve_of_the_binomial_pair(alpha) -> None:
    """The likelihood ratio grows with y, so the best test says "present" when
    y >= tau = s Phi^-1(1 - alpha); beta = P[y < tau] = sum_k Binom(k) Phi((tau - k) / s)."""
    T, q, sigma = 50, 0.05, 0.7
    s = sigma * math.sqrt(T)
    k = np.arange(T + 1)
    tau = s * stats.norm.isf(alpha)
    ref = float(np.sum(stats.binom.pmf(k, T, q) * stats.norm.cdf((tau - k) / s)))
    run = DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)
    assert LastIterateHeuristic(run).beta(alpha) == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_beta_of_a_noiseless_run_and_of_no_steps() -> None:
    noiseless = LastIterateHeuristic([(0.0, 0.1, 3)])
    assert noiseless.beta(0.0) == 1.0 and noiseless.beta(0.3) == 0.0
    assert noiseless.beta(1.0) == 0.0
    empty = LastIterateHeuristic([])
    assert empty.beta(0.3) == pytest.approx(0.7, abs=1e-15)  # P == Q: beta = 1 - alpha
    assert empty.beta(0.0) == 1.0


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan")])
def test_beta_rejects_alpha_outside_the_unit_interval(alpha) -> None:
    with pytest.raises(ValueError, match=r"`alpha` must be (in \[0, 1\]|a number)"):
        LastIterateHeuristic([(1.0, 0.1, 3)]).beta(alpha)


# -- refused inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("accuracy", [0.0, 1.0, 1.5])
def test_accuracy_outside_the_open_unit_interval_is_named(accuracy) -> None:
    with pytest.raises(ValueError, match=r"`accuracy` must be in \(0, 1\)"):
        LastIterateHeuristic([(1.0, 0.1, 3)], accuracy=accuracy)


@pytest.mark.parametrize(
    ("cls", "name"),
    [(LastIterateHeuristic, "LastIterateHeuristic"), (RobustLastIterateHeuristic, "RobustLastIterateHeuristic")],
)
def test_a_shuffled_run_is_refused_naming_the_model(cls, name) -> None:
    run = DPSGDRun.from_history([(1.0, 0.1, 20)], sampling=ShuffledBatches(100, 10))
    with pytest.raises(ValueError, match=rf"but {name} is the model of Poisson-sampled batches"):
        cls(run)


# -- the pair's delta for segments ------------------------------------------------------------------


def test_segments_delta_of_a_noiseless_step_is_one_and_of_no_steps_zero() -> None:
    noiseless = (TrainingSegment(1.0, 0.1, 5), TrainingSegment(0.0, 0.1, 1))
    assert segments_delta(noiseless, 3.0) == 1.0
    assert segments_delta((), 0.5) == 0.0
    assert segments_delta((TrainingSegment(1.0, 0.1, 0),), 0.5) == 0.0
