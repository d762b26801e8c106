"""The weighted heuristic (issue 5): per-step weights from schedules and momentum.

References used here are independent of the grid convolution under test: the existing
constant-rate heuristic, an explicit enumeration of all 2^T inclusion patterns (itertools)
evaluated by the independent quadrature of ``_reference.py`` (or, for the largest T, by the
package's hockey-stick engine on that enumerated support), and closed forms.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.analysis.last_iterate import weighted_heuristic as wh
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_delta_result,
    weighted_heuristic_epsilon_result,
    weighted_heuristic_pair,
    weighted_sum_distribution,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.exceptions import WeightedAccuracyWarning
from tests.analysis._reference import QuadratureHeuristic

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")


def _enumerate(weights, rates):
    """All 2^T inclusion patterns: shifts sum_t b_t w_t with probabilities prod q or 1 - q."""
    w = np.asarray(weights, float)
    q = np.broadcast_to(np.asarray(rates, float), w.shape)
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    keep = probs > 0
    return bits[keep] @ w, probs[keep]


def _scale(weights, sigmas):
    w = np.asarray(weights, float)
    s = np.broadcast_to(np.asarray(sigmas, float), w.shape)
    return math.sqrt(float(np.sum((w * s) ** 2)))


def _exact_epsilon(weights, rates, sigmas, delta, *, quadrature=True):
    x, p = _enumerate(weights, rates)
    s = _scale(weights, sigmas)
    if quadrature:
        return QuadratureHeuristic(1, 0.5, s, weights=p, shifts=x).epsilon(delta)
    return ShiftedGaussianMixture(x, np.log(p), s).epsilon(delta)


# -- constant weights: the exact binomial path -------------------------------------------------


@pytest.mark.parametrize(
    "T,q,sigma,delta,w",
    [
        (1, 0.1, 1.0, 1e-6, 1.0),
        (3, 0.1, 1.0, 1e-6, 0.05),
        (100, 0.01, 0.8, 1e-5, 3.0),
        (1000, 0.001, 1.2, 1e-8, 1e-3),
        (5000, 0.05, 2.0, 1e-6, 0.1),
        (17, 1.0, 4.0, 1e-3, 7.0),
    ],
)
def test_constant_weights_equal_the_constant_rate_heuristic(T, q, sigma, delta, w):
    r = weighted_heuristic_epsilon_result(delta, weights=[w] * T, sample_rates=q, noise_multipliers=sigma)
    ref = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    assert r.exact and r.relative_accuracy == 0.0
    assert r.epsilon == pytest.approx(ref, rel=1e-9, abs=1e-12)
    eps = max(ref, 0.5)
    rd = weighted_heuristic_delta_result(eps, weights=[w] * T, sample_rates=q, noise_multipliers=sigma)
    ref_d = LastIterateHeuristic(DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
    assert rd.delta == pytest.approx(ref_d, rel=1e-9, abs=1e-300)


def test_constant_weights_with_varying_rates_and_noise_equal_the_history_form():
    rng = np.random.default_rng(3)
    q = rng.choice([0.01, 0.05, 0.2], size=40)
    sigma = rng.choice([0.8, 1.0, 1.5], size=40)
    r = weighted_heuristic_epsilon_result(
        1e-6, weights=np.full(40, 0.3), sample_rates=q, noise_multipliers=sigma
    )
    ref = LastIterateHeuristic([(s, r_, 1) for s, r_ in zip(sigma, q, strict=True)]).epsilon(1e-6)
    assert r.exact
    assert r.epsilon == pytest.approx(ref, rel=1e-9)


def test_zero_weights_are_ignored_and_all_zero_is_perfectly_private():
    ref = privacy_model("heuristic", DPSGDRun.constant(steps=4, sample_rate=0.1, noise_multiplier=1.0)).epsilon(1e-6)
    r = weighted_heuristic_epsilon_result(
        1e-6, weights=[0, 2, 2, 0, 2, 2], sample_rates=0.1, noise_multipliers=1.0
    )
    assert r.epsilon == pytest.approx(ref, rel=1e-12) and r.steps == 4
    z = weighted_heuristic_epsilon_result(
        1e-6, weights=[0.0, 0.0], sample_rates=0.1, noise_multipliers=1.0
    )
    assert z.epsilon == 0.0 and z.exact


# -- general weights against the 2^T enumeration ------------------------------------------------


def _random_case(seed: int, T: int):
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.05, 1.0, T)
    q = rng.uniform(0.02, 0.6, T)
    sigma = rng.uniform(0.5, 2.0, T)
    return w, q, sigma


def _check_bracket(r, exact, accuracy):
    assert r.relative_accuracy <= accuracy
    assert r.value >= exact * (1 - 1e-9), (r.value, exact)  # never below the exact value
    assert r.value <= exact * (1 + r.relative_accuracy) + 1e-12  # within the stated accuracy
    assert r.lower_bound <= exact * (1 + 1e-9)


@pytest.mark.parametrize("seed,T", [(0, 2), (1, 4), (2, 6), (3, 8), (4, 9)])
@pytest.mark.parametrize("delta", [1e-6, 1e-3])
def test_random_weights_against_enumeration_and_quadrature(seed, T, delta):
    w, q, sigma = _random_case(seed, T)
    exact = _exact_epsilon(w, q, sigma, delta)
    r = weighted_heuristic_epsilon_result(delta, weights=w, sample_rates=q, noise_multipliers=sigma)
    assert not r.exact
    _check_bracket(r, exact, 1e-3)


@pytest.mark.parametrize(
    "seed,T,accuracy", [(10, 12, 1e-3), (11, 14, 1e-3), (12, 14, 1e-4), (13, 13, 1e-2)]
)
def test_random_weights_up_to_14_steps_against_enumeration(seed, T, accuracy):
    w, q, sigma = _random_case(seed, T)
    exact = _exact_epsilon(w, q, sigma, 1e-6, quadrature=False)
    r = weighted_heuristic_epsilon_result(
        1e-6, weights=w, sample_rates=q, noise_multipliers=sigma, accuracy=accuracy
    )
    _check_bracket(r, exact, accuracy)


def _check_against_quadrature(seed, T):
    w, q, sigma = _random_case(seed, T)
    exact = _exact_epsilon(w, q, sigma, 1e-6)
    r = weighted_heuristic_epsilon_result(1e-6, weights=w, sample_rates=q, noise_multipliers=sigma)
    _check_bracket(r, exact, 1e-3)


@pytest.mark.parametrize("seed", [20, 21])  # about 3 s each
def test_random_weights_12_steps_against_quadrature(seed):
    _check_against_quadrature(seed, 12)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [22, 23])  # 70-100 s each (16384 quadrature components)
def test_random_weights_14_steps_against_quadrature(seed):
    _check_against_quadrature(seed, 14)


@pytest.mark.parametrize("seed,T,eps", [(30, 5, 1.0), (31, 8, 2.0), (32, 12, 0.5)])
def test_delta_against_enumeration(seed, T, eps):
    w, q, sigma = _random_case(seed, T)
    x, p = _enumerate(w, q)
    exact = ShiftedGaussianMixture(x, np.log(p), _scale(w, sigma)).delta(eps)
    r = weighted_heuristic_delta_result(eps, weights=w, sample_rates=q, noise_multipliers=sigma)
    assert r.quantity == "delta" and r.epsilon == eps
    assert r.relative_accuracy <= 1e-3
    assert exact * (1 - 1e-9) <= r.delta <= exact * (1 + r.relative_accuracy) + 1e-15
    assert r.lower_bound <= exact * (1 + 1e-9)


def test_weights_on_the_grid_are_exact_for_a_long_two_level_schedule():
    """Weights 1 and 1/2 lie on every even grid, so up == down and the value is exact; the
    reference convolves the two binomials independently (scipy pmfs, double sum)."""
    from scipy import stats

    n1, n2, q, sigma = 600, 1400, 0.02, 0.9
    w = np.r_[np.ones(n1), np.full(n2, 0.5)]
    r = weighted_heuristic_epsilon_result(1e-6, weights=w, sample_rates=q, noise_multipliers=sigma)
    assert r.relative_accuracy == 0.0 and not r.exact
    k1, k2 = np.arange(n1 + 1), np.arange(n2 + 1)
    p = np.outer(stats.binom.pmf(k1, n1, q), stats.binom.pmf(k2, n2, q))
    shifts = (k1[:, None] + 0.5 * k2[None, :]).ravel()
    keep = p.ravel() > 1e-200
    ref = ShiftedGaussianMixture(
        shifts[keep], np.log(p.ravel()[keep]), sigma * math.sqrt(n1 + n2 / 4)
    )
    assert r.epsilon == pytest.approx(ref.epsilon(1e-6), rel=1e-9)


def test_scale_invariance_and_tighter_accuracy_tightens_the_bracket():
    w, q, sigma = _random_case(40, 30)
    a = weighted_heuristic_epsilon_result(
        1e-6, weights=w, sample_rates=q, noise_multipliers=sigma, accuracy=1e-2
    )
    b = weighted_heuristic_epsilon_result(
        1e-6, weights=w * 123.0, sample_rates=q, noise_multipliers=sigma, accuracy=1e-2
    )
    assert b.epsilon == pytest.approx(a.epsilon, rel=1e-9)
    c = weighted_heuristic_epsilon_result(
        1e-6, weights=w, sample_rates=q, noise_multipliers=sigma, accuracy=1e-4
    )
    assert c.relative_accuracy <= 1e-4 < a.relative_accuracy <= 1e-2
    # both brackets contain the exact value, so they overlap and the tight one is inside
    assert a.lower_bound <= c.epsilon * (1 + 1e-9) and c.lower_bound <= a.epsilon * (1 + 1e-9)
    assert c.resolution > a.resolution


# -- momentum --------------------------------------------------------------------------------


def test_momentum_full_batch_is_the_gaussian_mechanism_and_lowers_epsilon():
    """q = 1: P = N(sum w, s^2), so mu = sum w / (sigma sqrt(sum w^2)) <= sqrt(T) / sigma by
    Cauchy-Schwarz, with equality only for constant weights: momentum must lower epsilon."""
    T, sigma, delta = 8, 2.0, 1e-6
    w = sgd_weights(np.full(T, 0.1), momentum=0.9)
    assert not np.allclose(w, w[0])
    mu = w.sum() / (sigma * math.sqrt(np.sum(w * w)))
    r = weighted_heuristic_epsilon_result(delta, weights=w, sample_rates=1.0, noise_multipliers=sigma)
    closed = gaussian_epsilon(mu=mu, delta=delta)
    assert closed <= r.epsilon <= closed * (1 + r.relative_accuracy) + 1e-12
    assert r.epsilon < privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=1.0, noise_multiplier=sigma)).epsilon(delta)


@pytest.mark.parametrize(
    "q,sigma,delta,direction",
    [
        # many-selection (chi^2) regime: the first-order term (sum w q)^2 / (sigma^2 sum w^2)
        # is largest for constant weights, so momentum lowers epsilon
        (0.1, 3.0, 1e-6, -1),
        (0.5, 0.5, 1e-6, -1),
        # rare-event regime (small q and sigma): epsilon is set by a single selection, whose
        # largest shift max w / sqrt(sum w^2) grows under momentum, so epsilon rises
        (0.01, 0.5, 1e-6, +1),
    ],
)
def test_momentum_changes_epsilon_in_the_predicted_direction(q, sigma, delta, direction):
    T = 6
    w = sgd_weights(np.full(T, 0.1), momentum=0.9)
    assert np.all(np.diff(w) < 0)  # earlier steps weigh more: eta (1 - 0.9^(T-t+1)) / 0.1
    assert w[0] / math.sqrt(np.sum(w * w)) > 1 / math.sqrt(T)
    exact_momentum = _exact_epsilon(w, q, sigma, delta)
    exact_plain = _exact_epsilon(np.ones(T), q, sigma, delta)
    r = weighted_heuristic_epsilon_result(delta, weights=w, sample_rates=q, noise_multipliers=sigma)
    plain = weighted_heuristic_epsilon_result(
        delta, weights=np.full(T, 0.1), sample_rates=q, noise_multipliers=sigma
    )
    _check_bracket(r, exact_momentum, 1e-3)
    assert plain.epsilon == pytest.approx(exact_plain, rel=1e-5)
    assert np.sign(exact_momentum - exact_plain) == direction
    assert np.sign(r.epsilon - plain.epsilon) == direction


# -- the grid distribution -------------------------------------------------------------------


def test_weighted_sum_distribution_against_enumeration():
    units = np.array([3, 1, 3, 3, 7, 1, 2, 3, 7, 5], dtype=np.int64)
    rates = np.array([0.1, 0.5, 0.1, 0.1, 0.3, 0.5, 0.9, 0.1, 0.3, 0.05])
    offset, pmf, dropped = weighted_sum_distribution(units, rates)
    x, p = _enumerate(units.astype(float), rates)
    ref = np.bincount(x.astype(int), weights=p)
    full = np.zeros(max(ref.size, offset + pmf.size))
    full[offset : offset + pmf.size] = pmf
    ref = np.r_[ref, np.zeros(full.size - ref.size)]
    assert dropped <= 1e-29
    assert np.allclose(full, ref, rtol=1e-12, atol=1e-31)


def test_tail_masses_keep_relative_precision():
    """Direct non-negative convolution: the mass of "every step sampled" is q^T to ~1e-12."""
    T, q = 40, 0.2
    offset, pmf, _ = weighted_sum_distribution(np.full(T, 2, dtype=np.int64), np.full(T, q))
    top = offset + pmf.size - 1
    assert top == 2 * T
    assert pmf[-1] == pytest.approx(q**T, rel=1e-12)  # 1e-28, far below FFT round-off
    offset, pmf, _ = weighted_sum_distribution(np.arange(1, 31, dtype=np.int64), np.full(30, q))
    assert offset + pmf.size - 1 == 465 and pmf[-1] == pytest.approx(q**30, rel=1e-12)


def test_rounded_pairs_bracket_the_exact_pair():
    w, q, sigma = _random_case(50, 7)
    exact = _exact_epsilon(w, q, sigma, 1e-5, quadrature=False)
    up = weighted_heuristic_pair(weights=w, sample_rates=q, noise_multipliers=sigma, resolution=8)
    down = weighted_heuristic_pair(
        weights=w, sample_rates=q, noise_multipliers=sigma, resolution=8, rounding="down"
    )
    assert down.epsilon(1e-5) < exact < up.epsilon(1e-5)


def test_grid_size_limit_warns_and_keeps_an_upper_bound(monkeypatch):
    monkeypatch.setattr(wh, "_MAX_GRID_POINTS", 3000)
    w, q, sigma = _random_case(60, 10)
    with pytest.warns(WeightedAccuracyWarning, match="requested"):
        r = weighted_heuristic_epsilon_result(
            1e-6, weights=w, sample_rates=q, noise_multipliers=sigma, accuracy=1e-5
        )
    assert not r.converged and r.relative_accuracy > 1e-5
    assert r.epsilon >= _exact_epsilon(w, q, sigma, 1e-6, quadrature=False) * (1 - 1e-9)


def test_result_object():
    r = weighted_heuristic_epsilon_result(
        1e-6, weights=[1.0, 0.5, 0.3], sample_rates=0.1, noise_multipliers=1.0
    )
    assert float(r) == r.epsilon == r.value and r.delta == 1e-6 and r.converged
    with pytest.raises(AttributeError):
        r.value = 0.0  # frozen


# -- bad input -------------------------------------------------------------------------------

BAD = [
    (dict(weights=[1.0, -1.0]), ValueError, r"`weights\[1\]` must be in \[0, inf\), got -1\.0"),
    (dict(weights=[1.0, float("nan")]), ValueError, r"`weights\[1\]`"),
    (dict(weights=[[1.0]]), ValueError, "`weights`"),
    (dict(weights="abc"), TypeError, "`weights`"),
    (dict(weights=[1.0, "x"]), TypeError, r"`weights\[1\]`"),
    (
        dict(sample_rates=[0.1, 0.2, 0.3]),
        ValueError,
        r"`sample_rates` must have one entry per weight \(2\), got 3",
    ),
    (
        dict(sample_rates=[0.1, 1.5]),
        ValueError,
        r"`sample_rates\[1\]` must be in \(0, 1\], got 1\.5",
    ),
    (dict(sample_rates=0.0), ValueError, r"`sample_rates` must be in \(0, 1\]"),
    (dict(noise_multipliers=[1.0, 0.0]), ValueError, r"`noise_multipliers\[1\]`"),
    (dict(accuracy=0.0), ValueError, r"`accuracy` must be in \(0, 1\), got 0\.0"),
    (dict(accuracy=1.0), ValueError, "`accuracy`"),
    (dict(delta=0.0), ValueError, "`delta`"),
]


@pytest.mark.parametrize("override,exc,pattern", BAD)
def test_bad_input_names_the_parameter(override, exc, pattern):
    kwargs = (
        dict(delta=1e-6, weights=[1.0, 0.5], sample_rates=0.1, noise_multipliers=1.0) | override
    )
    delta = kwargs.pop("delta")
    with pytest.raises(exc, match=pattern):
        weighted_heuristic_epsilon_result(delta, **kwargs)


def test_bad_delta_arguments():
    with pytest.raises(ValueError, match="`epsilon`"):
        weighted_heuristic_delta_result(-1.0, weights=[1.0], sample_rates=0.1, noise_multipliers=1.0)
    with pytest.raises(ValueError, match="`rounding`"):
        weighted_heuristic_pair(
            weights=[1.0], sample_rates=0.1, noise_multipliers=1.0, resolution=4, rounding="x"
        )
    with pytest.raises(ValueError, match="`resolution`"):
        weighted_heuristic_pair(
            weights=[1.0], sample_rates=0.1, noise_multipliers=1.0, resolution=0
        )


def test_no_warning_in_normal_use():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weighted_heuristic_epsilon_result(
            1e-6, weights=[1.0, 0.7, 0.2], sample_rates=0.2, noise_multipliers=1.0
        )
