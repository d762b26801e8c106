"""Counterexample analysers (issue 5): quadratic regulariser, zeroing regulariser and the
non-monotonicity check. Paper values: Steinke et al. (ICLR 2025), Section 4.2."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.counterexamples import (
    EXACT_MAX_STEPS,
    heuristic_monotonicity,
    one_step_noise_multiplier,
    quadratic_regulariser_comparison,
    quadratic_regulariser_epsilon,
    quadratic_regulariser_pair,
    quadratic_regulariser_weights,
    zeroing_regulariser_epsilon,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from tests.analysis._reference import QuadratureHeuristic

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")

PAPER = dict(steps=3, sample_rate=0.1, noise_multiplier=1.0)


def _reference(T, q, sigma, alpha):
    """Independent support: every pattern b in {0,1}^T, shift sum_i (1-alpha)^(i-1) b_i."""
    c = 1.0 - alpha
    shifts, probs = [], []
    for b in itertools.product([0, 1], repeat=T):
        shifts.append(sum(c**i for i, bit in enumerate(b) if bit))
        probs.append(math.prod(q if bit else 1 - q for bit in b))
    s = sigma * math.sqrt(sum(c ** (2 * i) for i in range(T)))
    return np.array(shifts), np.array(probs), s


# -- the paper's numbers -----------------------------------------------------------------------


@pytest.mark.parametrize("alpha,expected", [(0.0, 2.222), (1.0, 2.182)])
@pytest.mark.parametrize("method", ["exact", "auto"])
def test_paper_values_for_alpha_0_and_1(alpha, expected, method):
    r = quadratic_regulariser_epsilon(1e-6, alpha=alpha, method=method, **PAPER)
    assert round(r.epsilon, 3) == expected
    shifts, probs, s = _reference(3, 0.1, 1.0, alpha)
    keep = probs > 0
    ref = QuadratureHeuristic(1, 0.5, s, weights=probs[keep], shifts=shifts[keep]).epsilon(1e-6)
    assert r.epsilon == pytest.approx(ref, rel=1e-6)


def test_paper_value_for_alpha_half_exceeds_both():
    """The paper: not (eps, 1e-6)-DP for any eps < 2.274; the exact value lies just above."""
    r = quadratic_regulariser_epsilon(1e-6, alpha=0.5, **PAPER)
    assert r.method == "exact"
    assert 2.274 <= r.epsilon < 2.2755
    shifts, probs, s = _reference(3, 0.1, 1.0, 0.5)
    ref = QuadratureHeuristic(1, 0.5, s, weights=probs, shifts=shifts).epsilon(1e-6)
    assert r.epsilon == pytest.approx(ref, rel=1e-6)
    # the pair at eps = 2.274 violates delta = 1e-6
    pair = quadratic_regulariser_pair(alpha=0.5, **PAPER)
    assert pair.delta(2.274) > 1e-6
    c = quadratic_regulariser_comparison(1e-6, alpha=0.5, **PAPER)
    assert c.exceeds_heuristic and c.quadratic.epsilon > c.epsilon_one_step
    assert round(c.epsilon_linear, 3) == 2.222 and round(c.epsilon_one_step, 3) == 2.182
    assert c.epsilon_robust == c.epsilon_linear and c.robust_steps == 3
    assert c.ratio_to_robust == pytest.approx(r.epsilon / c.epsilon_linear)


def test_alpha_one_is_one_step_and_alpha_zero_is_the_heuristic():
    for T in (1, 5, 9):
        one = quadratic_regulariser_epsilon(
            1e-5, steps=T, sample_rate=0.05, noise_multiplier=0.9, alpha=1.0, method="exact"
        )
        assert one.epsilon == pytest.approx(
            privacy_model("heuristic", DPSGDRun.constant(steps=1, sample_rate=0.05, noise_multiplier=0.9)).epsilon(1e-5), rel=1e-9
        )
        assert one.epsilon == pytest.approx(
            zeroing_regulariser_epsilon(1e-5, sample_rate=0.05, noise_multiplier=0.9), rel=1e-9
        )
        lin = quadratic_regulariser_epsilon(
            1e-5, steps=T, sample_rate=0.05, noise_multiplier=0.9, alpha=0.0, method="exact"
        )
        assert lin.epsilon == pytest.approx(
            privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=0.05, noise_multiplier=0.9)).epsilon(1e-5), rel=1e-9
        )


def test_weights():
    assert np.allclose(quadratic_regulariser_weights(4, 0.5), [0.125, 0.25, 0.5, 1.0])
    assert np.array_equal(quadratic_regulariser_weights(3, 1.0), [0.0, 0.0, 1.0])
    assert np.array_equal(quadratic_regulariser_weights(3, 0.0), [1.0, 1.0, 1.0])


# -- exact enumeration and the paper's rounding ------------------------------------------------


@pytest.mark.parametrize(
    "T,alpha,q,sigma", [(6, 0.3, 0.1, 1.0), (7, 0.8, 0.5, 2.0), (5, 0.5, 0.01, 0.6)]
)
def test_exact_enumeration_against_quadrature(T, alpha, q, sigma):
    r = quadratic_regulariser_epsilon(
        1e-6, steps=T, sample_rate=q, noise_multiplier=sigma, alpha=alpha, method="exact"
    )
    shifts, probs, s = _reference(T, q, sigma, alpha)
    ref = QuadratureHeuristic(1, 0.5, s, weights=probs, shifts=shifts).epsilon(1e-6)
    assert r.epsilon == pytest.approx(ref, rel=1e-6)


@pytest.mark.parametrize("T", [8, 12])
@pytest.mark.parametrize("alpha,q,sigma", [(0.3, 0.1, 1.0), (0.5, 0.01, 0.6), (0.8, 0.5, 2.0)])
def test_paper_rounding_brackets_the_exact_value(T, alpha, q, sigma):
    """Rounding up gives an upper bound, the mirror image a lower bound; the paper expects
    at most about 5% on the support values (observed up to about 5% on epsilon here)."""
    kw = dict(steps=T, sample_rate=q, noise_multiplier=sigma, alpha=alpha)
    exact = quadratic_regulariser_epsilon(1e-6, method="exact", **kw).epsilon
    paper = quadratic_regulariser_epsilon(1e-6, method="paper", **kw)
    assert paper.epsilon_lower <= exact <= paper.epsilon <= 1.08 * exact
    grid = quadratic_regulariser_epsilon(1e-6, method="grid", accuracy=1e-3, **kw)
    assert exact * (1 - 1e-9) <= grid.epsilon <= exact * (1 + 1e-3)


def test_paper_rounding_keeps_powers_of_the_ratio():
    """Support values 0, 1, 1.05^-1 ... are on the geometric grid already: alpha = 1 (values
    0 and 1) is reproduced exactly."""
    kw = dict(steps=20, sample_rate=0.1, noise_multiplier=1.0, alpha=1.0)
    paper = quadratic_regulariser_epsilon(1e-6, method="paper", **kw)
    assert paper.epsilon == pytest.approx(
        privacy_model("heuristic", DPSGDRun.constant(steps=1, sample_rate=0.1, noise_multiplier=1.0)).epsilon(1e-6), rel=1e-9
    )


def test_auto_uses_the_grid_for_large_T_and_it_is_consistent_with_the_paper_rounding():
    kw = dict(steps=40, sample_rate=0.1, noise_multiplier=1.0, alpha=0.5)
    grid = quadratic_regulariser_epsilon(1e-6, **kw)
    assert grid.method == "grid"
    paper = quadratic_regulariser_epsilon(1e-6, method="paper", **kw)
    # both bracket the same exact value
    assert paper.epsilon_lower <= grid.epsilon and grid.epsilon_lower <= paper.epsilon
    # the weights beyond 2^-16 move the exact value by far less than the grid accuracy
    t16 = quadratic_regulariser_epsilon(1e-6, method="exact", **(kw | dict(steps=16))).epsilon
    assert grid.epsilon_lower * (1 - 1e-4) <= t16 <= grid.epsilon * (1 + 1e-4)


# -- zeroing regulariser, robust variant, monotonicity -----------------------------------------


def test_robust_wrapper_is_the_robust_heuristic():
    kw = dict(steps=60, sample_rate=0.01, noise_multiplier=0.5)
    assert privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(1e-5) == privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(1e-5)
    assert privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(1e-5) >= zeroing_regulariser_epsilon(
        1e-5, sample_rate=0.01, noise_multiplier=0.5
    )


def test_non_monotone_configuration():
    T, q, sigma, delta = 60, 0.01, 0.5, 1e-5
    per_t = [
        privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
        for t in range(1, T + 1)
    ]
    m = heuristic_monotonicity(delta, steps=T, sample_rate=q, noise_multiplier=sigma)
    assert m.non_monotone
    assert m.max_epsilon == max(per_t) and m.argmax_steps == 1 + int(np.argmax(per_t))
    assert m.epsilon_at_steps == per_t[-1] < m.max_epsilon
    assert m.max_epsilon == privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)


def test_monotone_configuration():
    m = heuristic_monotonicity(1e-6, **PAPER)
    assert not m.non_monotone and m.argmax_steps == 3 and m.max_epsilon == m.epsilon_at_steps
    zero = heuristic_monotonicity(1e-6, steps=0, sample_rate=0.1, noise_multiplier=1.0)
    assert not zero.non_monotone and zero.max_epsilon == 0.0


@pytest.mark.slow
def test_monotonicity_beyond_the_exhaustive_range():
    T, q, sigma, delta = 3000, 0.002, 0.6, 1e-6
    m = heuristic_monotonicity(delta, steps=T, sample_rate=q, noise_multiplier=sigma)
    per_t = [
        privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
        for t in range(1, T + 1)
    ]
    assert m.max_epsilon == pytest.approx(max(per_t), rel=1e-9)


# -- calibration and bad input -----------------------------------------------------------------


@pytest.mark.parametrize("eps,q", [(1.0, 0.01), (2.0, 0.1), (1.0, 0.5)])
def test_one_step_calibration(eps, q):
    sigma = one_step_noise_multiplier(eps, 1e-6, q)
    assert privacy_model("heuristic", DPSGDRun.constant(steps=1, sample_rate=q, noise_multiplier=sigma)).epsilon(1e-6) == pytest.approx(
        eps, rel=1e-9
    )


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(alpha=1.5), ValueError, r"`alpha` must be in \[0, 1\], got 1\.5"),
        (dict(alpha=-0.1), ValueError, "`alpha`"),
        (dict(steps=0), ValueError, "`steps`"),
        (dict(sample_rate=0.0), ValueError, "`sample_rate`"),
        (dict(noise_multiplier=-1.0), ValueError, "`noise_multiplier`"),
        (dict(method="fft"), ValueError, "`method`"),
        (
            dict(method="exact", steps=EXACT_MAX_STEPS + 1),
            ValueError,
            f"`steps` must be <= {EXACT_MAX_STEPS}",
        ),
    ],
)
def test_bad_input(kwargs, exc, pattern):
    kw = dict(steps=3, sample_rate=0.1, noise_multiplier=1.0, alpha=0.5) | kwargs
    with pytest.raises(exc, match=pattern):
        quadratic_regulariser_epsilon(1e-6, **kw)


def test_bad_calibration_input():
    with pytest.raises(ValueError, match="`delta` must be below `sample_rate`"):
        one_step_noise_multiplier(1.0, 0.2, 0.1)
    with pytest.raises(ValueError, match="`epsilon`"):
        one_step_noise_multiplier(0.0, 1e-6, 0.1)
