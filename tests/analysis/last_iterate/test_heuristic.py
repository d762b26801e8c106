"""Accuracy and properties of the last-iterate heuristic (issue 2, "Must show")."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from tests.analysis._reference import QuadratureHeuristic

REL_TOL = 1e-5  # the tolerance; observed agreement is about 1e-9


def _grid() -> list[tuple[int, float, float, float]]:
    """A fixed, seeded sample of the product grid T x q x sigma x delta.

    The quadrature reference works in linear space, so configurations whose signal-to-noise
    bound (Tq + 10 sqrt(Tq) + 10) / (sigma sqrt(T)) exceeds 25 (eps in the hundreds) are
    left to the q = 1 closed-form test below.
    """
    Ts = [1, 2, 3, 10, 100, 1000, 10000]
    qs = [1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0]
    sigmas = [0.3, 0.5, 1.0, 2.0, 10.0]
    deltas = [1e-10, 1e-6, 1e-5, 1e-2]
    cfgs = [
        c
        for c in itertools.product(Ts, qs, sigmas, deltas)
        if (c[0] * c[1] + 10 * math.sqrt(c[0] * c[1]) + 10) / (c[2] * math.sqrt(c[0])) <= 25
    ]
    random.Random(0).shuffle(cfgs)
    return cfgs


GRID = _grid()


def _check_against_quadrature(T: int, q: float, sigma: float, delta: float) -> None:
    ours = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    ref = QuadratureHeuristic(T, q, sigma).epsilon(delta)
    if ref == 0.0:
        assert ours == pytest.approx(0.0, abs=1e-9)
        return
    assert abs(ours - ref) <= REL_TOL * ref, (ours, ref)
    assert ours >= ref * (1 - REL_TOL)  # never below the independent value


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("T,q,sigma,delta", GRID[:36])
def test_matches_independent_quadrature(T, q, sigma, delta):
    _check_against_quadrature(T, q, sigma, delta)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("T,q,sigma,delta", GRID[36:160])
def test_matches_independent_quadrature_extended(T, q, sigma, delta):
    _check_against_quadrature(T, q, sigma, delta)


@pytest.mark.parametrize("T,expected", [(3, 2.222), (1, 2.182)])
def test_paper_values(T, expected):
    eps = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=0.1, noise_multiplier=1.0)).epsilon(1e-6)
    assert round(eps, 3) == expected


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 20000),
    sigma=st.floats(0.3, 10.0),
    delta=st.sampled_from([1e-10, 1e-6, 1e-5, 1e-3, 1e-2]),
)
def test_full_sampling_is_the_gaussian_mechanism(T, sigma, delta):
    """q = 1: K = T exactly, so the pair is N(T, s^2) vs N(0, s^2), mu = sqrt(T) / sigma."""
    ours = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=1.0, noise_multiplier=sigma)).epsilon(delta)
    closed = gaussian_epsilon(mu=math.sqrt(T) / sigma, delta=delta)
    assert ours == pytest.approx(closed, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 5000),
    q=st.floats(1e-4, 1.0),
    sigma=st.floats(0.3, 10.0),
    d1=st.floats(1e-10, 0.5),
    d2=st.floats(1e-10, 0.5),
)
def test_epsilon_decreases_as_delta_grows(T, q, sigma, d1, d2):
    lo, hi = sorted((d1, d2))
    e_lo = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(lo)
    e_hi = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(hi)
    assert e_hi <= e_lo + 1e-9 * max(1.0, e_lo)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 5000),
    q=st.floats(1e-4, 1.0),
    sigma=st.floats(0.3, 10.0),
    delta=st.floats(1e-10, 0.1),
)
def test_delta_and_epsilon_are_inverse(T, q, sigma, delta):
    eps = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    if eps > 0:
        back = LastIterateHeuristic(DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(eps)
        assert back == pytest.approx(delta, rel=1e-6)
    else:
        assert LastIterateHeuristic(DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).delta(0.0) <= delta


def test_zero_steps_is_perfectly_private():
    assert privacy_model("heuristic", DPSGDRun.constant(steps=0, sample_rate=0.1, noise_multiplier=1.0)).epsilon(1e-5) == 0.0
    assert LastIterateHeuristic(DPSGDRun.constant(steps=0, sample_rate=0.1, noise_multiplier=1.0)).delta(0.0) == 0.0
    assert LastIterateHeuristic([]).epsilon(1e-5) == 0.0


# -- history form ----------------------------------------------------------------------------


def test_history_of_one_segment_equals_scalar_form():
    h = [(1.1, 0.01, 500)]
    assert LastIterateHeuristic(h).epsilon(1e-5) == privacy_model("heuristic", DPSGDRun.constant(steps=500, sample_rate=0.01, noise_multiplier=1.1)).epsilon(1e-5)


def test_split_segments_equal_the_merged_one():
    merged = LastIterateHeuristic([(1.0, 0.05, 300)]).epsilon(1e-6)
    split = LastIterateHeuristic([(1.0, 0.05, 100), (1.0, 0.05, 150), (1.0, 0.05, 50)]).epsilon(1e-6)
    assert split == pytest.approx(merged, rel=1e-12)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_poisson_binomial_history_against_enumeration():
    """Varying (sigma, q): enumerate all 2^T inclusion patterns for the count pmf, then the
    quadrature reference on that mixture with noise variance sum sigma_t^2."""
    steps = [(0.8, 0.3), (1.5, 0.05), (1.0, 0.3), (0.6, 0.5), (2.0, 0.01), (1.2, 0.2)]
    pmf = np.zeros(len(steps) + 1)
    for pattern in itertools.product([0, 1], repeat=len(steps)):
        prob = math.prod(q if b else 1 - q for b, (_, q) in zip(pattern, steps))
        pmf[sum(pattern)] += prob
    variance = sum(s * s for s, _ in steps)
    ref = QuadratureHeuristic(1, 0.5, math.sqrt(variance), weights=pmf, shifts=np.arange(len(pmf)))
    history = [(s, q, 1) for s, q in steps]
    for delta in (1e-6, 1e-3):
        ours = LastIterateHeuristic(history).epsilon(delta)
        assert ours == pytest.approx(ref.epsilon(delta), rel=REL_TOL)
        assert ours >= ref.epsilon(delta) * (1 - REL_TOL)


# -- robust variant --------------------------------------------------------------------------


def test_robust_is_max_over_suffixes_exhaustive():
    """Small sigma: eps_1 > eps_T (non-monotone), so the robust value is attained early."""
    T, q, sigma, delta = 60, 0.01, 0.5, 1e-5
    per_t = [privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta) for t in range(1, T + 1)]
    robust = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    assert robust == max(per_t)
    assert robust > per_t[-1]  # this configuration is one where the heuristic is not monotone


@pytest.mark.slow
def test_robust_grid_search_finds_exhaustive_max():
    T, q, sigma, delta = 3000, 0.002, 0.6, 1e-6
    per_t = [privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta) for t in range(1, T + 1)]
    robust = privacy_model("robust_heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    assert robust == pytest.approx(max(per_t), rel=1e-9)


def test_robust_history_uses_suffixes():
    history = [(0.5, 0.01, 5), (3.0, 0.01, 20)]
    robust = RobustLastIterateHeuristic(history).epsilon(1e-5)
    suffixes = [LastIterateHeuristic(h).epsilon(1e-5) for h in (
        [(3.0, 0.01, t)] if t <= 20 else [(0.5, 0.01, t - 20), (3.0, 0.01, 20)] for t in range(1, 26)
    )]
    assert robust == pytest.approx(max(suffixes), rel=1e-12)


# -- bad input -------------------------------------------------------------------------------

BAD = [
    (dict(delta=float("nan")), ValueError, "delta"),
    (dict(delta=0.0), ValueError, "delta"),
    (dict(delta=1.0), ValueError, "delta"),
    (dict(noise_multiplier=-1.0), ValueError, "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), ValueError, "noise_multiplier"),
    (dict(sample_rate=0.0), ValueError, "sample_rate"),
    (dict(sample_rate=1.5), ValueError, "sample_rate"),
    (dict(steps=-1), ValueError, "steps"),
    (dict(steps=2.5), TypeError, "steps"),
    (dict(steps=True), TypeError, "steps"),
    (dict(sample_rate="0.1"), TypeError, "sample_rate"),
]


@pytest.mark.parametrize("override,exc,name", BAD)
def test_bad_input_names_the_parameter(override, exc, name):
    kwargs = dict(delta=1e-5, steps=10, sample_rate=0.1, noise_multiplier=1.0) | override
    delta = kwargs.pop("delta")
    with pytest.raises(exc, match=f"`{name}`"):
        privacy_model("heuristic", DPSGDRun.constant(**kwargs)).epsilon(delta)


def test_bad_history_entry_is_named():
    with pytest.raises(ValueError, match=r"history\[1\]\.sample_rate.*\(0, 1\].*2\.0"):
        LastIterateHeuristic([(1.0, 0.1, 3), (1.0, 2.0, 3)]).epsilon(1e-5)
    with pytest.raises(TypeError, match=r"history\[0\]"):
        LastIterateHeuristic([(1.0, 0.1)]).epsilon(1e-5)
    with pytest.raises(ValueError, match="epsilon"):
        LastIterateHeuristic([(1.0, 0.1, 3)]).delta(-1.0)
