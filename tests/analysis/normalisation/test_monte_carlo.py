"""Monte Carlo validation: simulate each mechanism, audit it with the likelihood-ratio test,
and compare with the computed curves.

(a) the audited delta(eps) (lower end of a simultaneous Clopper-Pearson band at level 0.999)
    never exceeds the computed curve;
(b) for exact models, the Monte Carlo estimate E[(1 - e^(eps - L))_+] is within 3% of the
    computed curve, or within 4 standard errors where that is wider (and 1e-9 absolute, the
    order of the tail mass the pessimistic discretisation sends to +inf).
Seeds are fixed, so the outcome is deterministic; the tolerances come from the statistics.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution

from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.analysis.normalisation.asgm import asgm_pld
from opacus_lastiterate.analysis.normalisation.divisor_leak import divisor_leak_pld
from opacus_lastiterate.analysis.normalisation.empirical import importance_delta, threshold_delta
from opacus_lastiterate.analysis.normalisation.simulation import (
    simulate_asgm,
    simulate_divisor_leak,
)

CONFIDENCE = 0.999
EPS = np.array([0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])


def _directions(pld, with_losses, without_losses):
    """(computed pmf, losses under upper, losses under lower) for remove and add."""
    return [
        (pld._pmf_remove, with_losses, without_losses),
        (pld._pmf_add, -without_losses, -with_losses),
    ]


def _assert_audit_below(pmf, upper, lower, eps=EPS) -> None:
    computed = np.asarray(pmf.get_delta_for_epsilon(eps))
    band = threshold_delta(upper, lower, eps, confidence=CONFIDENCE)
    assert np.all(band.lower <= computed + 1e-12), (band.lower, computed)


def _assert_close(pmf, upper, eps=EPS) -> None:
    computed = np.asarray(pmf.get_delta_for_epsilon(eps))
    est = importance_delta(upper, eps, z=4.0)
    half_width = est.upper - est.estimate
    tol = np.maximum(np.maximum(0.03 * computed, half_width), 1e-9)  # 1e-9: truncation mass
    assert np.all(np.abs(est.estimate - computed) <= tol), (est.estimate, computed, tol)


def _simulate_asgm(seed, trials, **kw):
    rng = np.random.default_rng(seed)
    return (
        simulate_asgm(rng, trials=trials, with_target=True, **kw),
        simulate_asgm(rng, trials=trials, with_target=False, **kw),
    )


def _simulate_leak(seed, trials, **kw):
    rng = np.random.default_rng(seed)
    return (
        simulate_divisor_leak(rng, trials=trials, with_target=True, **kw),
        simulate_divisor_leak(rng, trials=trials, with_target=False, **kw),
    )


@pytest.mark.parametrize(
    ("steps", "n", "q", "sigma", "trials"),
    [(1, 10, 0.2, 1.0, 200_000), (4, 20, 0.3, 1.5, 100_000)],
)
def test_asgm_batch_size_revealed(steps, n, q, sigma, trials) -> None:
    kw = dict(steps=steps, other_records=n, sample_rate=q, noise_multiplier=sigma)
    with_l, without_l = _simulate_asgm(1, trials, **kw)
    pld = asgm_pld(other_records=n, sample_rate=q, noise_multiplier=sigma, steps=steps)
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low)
        _assert_close(pmf, up)


def test_asgm_in_100_dimensions_stays_below_the_model() -> None:
    """Full 100-dimensional outputs: the batch size is only estimated from the norm, so the
    audit stays below the 'batch size revealed' curve (a post-processing of it)."""
    kw = dict(steps=1, other_records=6, sample_rate=0.3, noise_multiplier=1.0)
    with_l, without_l = _simulate_asgm(2, 20_000, dimension=100, full_vectors=True, **kw)
    pld = asgm_pld(other_records=6, sample_rate=0.3, noise_multiplier=1.0)
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low)


def test_asgm_in_a_million_dimensions_reaches_the_model() -> None:
    """d = 10^6: the norm reveals |B| exactly and the d-dimensional audit meets the curve."""
    kw = dict(steps=1, other_records=10, sample_rate=0.2, noise_multiplier=1.0)
    with_l, without_l = _simulate_asgm(3, 100_000, dimension=10**6, **kw)
    pld = asgm_pld(other_records=10, sample_rate=0.2, noise_multiplier=1.0)
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low)
        _assert_close(pmf, up)


def test_asgm_small_dataset_audit_beats_the_sgm_claim() -> None:
    """|D| = 4, q = 0.5, sigma = 1, d = 10^4: the audited delta at SGM's epsilon(1e-5) is far
    above 1e-5, so the SGM guarantee is violated; the ASGM curve still covers the audit."""
    q, s = 0.5, 1.0
    eps_sgm = standard_epsilon(1e-5, sample_rate=q, noise_multiplier=s, steps=1)
    kw = dict(steps=1, other_records=4, sample_rate=q, noise_multiplier=s)
    with_l, without_l = _simulate_asgm(4, 50_000, dimension=10_000, **kw)
    band = threshold_delta(with_l, without_l, [eps_sgm], confidence=CONFIDENCE)
    assert band.lower[0] > 100 * 1e-5
    pld = asgm_pld(other_records=4, sample_rate=q, noise_multiplier=s)
    assert band.lower[0] <= pld.get_delta_for_epsilon(eps_sgm)


def test_asgm_large_dataset_nearly_agrees_with_sgm() -> None:
    q, s = 0.01, 1.0
    kw = dict(steps=1, other_records=100_000, sample_rate=q, noise_multiplier=s)
    with_l, without_l = _simulate_asgm(5, 200_000, **kw)
    pld = asgm_pld(other_records=100_000, sample_rate=q, noise_multiplier=s)
    sgm = privacy_loss_distribution.from_gaussian_mechanism(s, sampling_prob=q)
    eps = np.array([0.0, 0.02, 0.05, 0.1])
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low, eps)
        _assert_close(pmf, up, eps)
    assert np.allclose(pld.get_delta_for_epsilon(eps), sgm.get_delta_for_epsilon(eps), rtol=0.01)


@pytest.mark.parametrize(
    ("c1", "c2", "q", "d", "steps", "full", "trials"),
    [
        (20.0, 21.0, 0.05, 100, 1, True, 50_000),  # EASGM-like, full 100-dim vectors
        (249.0, 250.0, 0.005, 10_000, 3, False, 100_000),  # Opacus N = 50000, L = 250
    ],
)
def test_divisor_leak(c1, c2, q, d, steps, full, trials) -> None:
    kw = dict(divisor_without=c1, divisor_with=c2, sample_rate=q, noise_multiplier=1.0, dimension=d)
    with_l, without_l = _simulate_leak(6, trials, steps=steps, full_vectors=full, **kw)
    pld = divisor_leak_pld(steps=steps, **kw)
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low)
        _assert_close(pmf, up)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "steps"), [(4, 1), (8, 10), (20, 25)])
def test_asgm_many_trials(n: int, steps: int) -> None:
    kw = dict(steps=steps, other_records=n, sample_rate=0.1, noise_multiplier=1.0)
    with_l, without_l = _simulate_asgm(7, 1_000_000, **kw)
    pld = asgm_pld(other_records=n, sample_rate=0.1, noise_multiplier=1.0, steps=steps)
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low)
        _assert_close(pmf, up)


@pytest.mark.slow
def test_divisor_leak_many_steps_large_dimension() -> None:
    kw = dict(
        divisor_without=255.0,
        divisor_with=256.0,
        sample_rate=1 / 235,
        noise_multiplier=1.0,
        dimension=100_000,
    )
    with_l, without_l = _simulate_leak(8, 200_000, steps=20, **kw)
    pld = divisor_leak_pld(steps=20, **kw)
    eps = np.array([0.0, 1.0, 2.0, 4.0, 8.0])
    for pmf, up, low in _directions(pld, with_l, without_l):
        _assert_audit_below(pmf, up, low, eps)
        _assert_close(pmf, up, eps)
