"""The vectorised RDP of the Poisson-subsampled Gaussian against the two references it
reproduces: dp_accounting's ``RdpAccountant`` (one event at a time) and Opacus's
``compute_rdp``; and RDPComposition against dp_accounting's accountant on runs whose noise
changes every step.

Tolerances: RDP vectors relative 1e-9 with an absolute floor of 1e-13 per step (both
references round log(A) near 0 at about 1e-15 absolute, which is a larger relative error
where the RDP is itself about 1e-8); epsilon and delta relative 1e-9. Opacus's fractional
orders: log(A) within 5e-13 absolute (its series stops at the first term below e^-30 in
each half, the two remainders of one sign: 2 e^-30 = 1.9e-13; ours sums the whole tail;
plus the rounding of its thousands of log-space additions: 2.9e-13 at most over 670,000
random triples), so RDP within 5e-13 / (a - 1); and ours against log(A) integrated to 30
digits (mpmath) within 1e-15 (measured: 2.4e-16 at most, Opacus's 8.7e-14)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp

from opacus_lastiterate.analysis.baselines.composition import RDPComposition
from opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp import (
    composed_rdp,
    poisson_gaussian_rdp,
)
from opacus_lastiterate.analysis.run import DPSGDRun

RTOL, ATOL = 1e-9, 1e-13
OPACUS_LOG_A = 5e-13  # Opacus's truncation (2 e^-30) and rounding, in log(A)


def _opacus_atol(orders):
    """The absolute RDP tolerance against Opacus at each order (module docstring)."""
    a = np.asarray(orders, dtype=float)
    return np.where(a == np.floor(a), 1e-12, OPACUS_LOG_A / (a - 1))


def _reference(pairs, orders, steps=None):
    """dp_accounting's accountant composing each (q, sigma) ``steps[k]`` times."""
    accountant = RdpAccountant(orders=list(orders))
    for k, (q, sigma) in enumerate(pairs):
        event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
        accountant.compose(event, 1 if steps is None else steps[k])
    return accountant


def _random_pairs(seed, n):
    rng = np.random.default_rng(seed)
    return [(float(10 ** rng.uniform(-4, -0.05)), float(10 ** rng.uniform(-0.5, 1.3)))
            for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1])
def test_each_pair_matches_dp_accounting_at_its_default_orders(seed):
    pairs = _random_pairs(seed, 6) + [(0.01, 1.0), (0.3, 0.6), (1e-4, 20.0)]
    ours = poisson_gaussian_rdp([q for q, _ in pairs], [s for _, s in pairs], DEFAULT_RDP_ORDERS)
    for k, pair in enumerate(pairs):
        ref = _reference([pair], DEFAULT_RDP_ORDERS).rdp
        np.testing.assert_allclose(ours[k], ref, rtol=RTOL, atol=ATOL, err_msg=str(pair))


def test_orders_dp_accounting_leaves_out_are_inf_as_there():
    # q = 0.1, sigma = 0.7: dp_accounting's fractional series does not stop within 1,000
    # terms at the lowest orders, which it then sets to inf (and logs a warning).
    orders = [1.1, 1.5, 2.5, 3.0, 7.5, 32.0]
    ref = _reference([(0.1, 0.7)], orders).rdp
    ours = poisson_gaussian_rdp([0.1], [0.7], orders)[0]
    assert np.isinf(ref[0])  # the case is the one described
    np.testing.assert_array_equal(np.isinf(ours), np.isinf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(ours[finite], ref[finite], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("seed", [2, 3])
def test_opacus_series_matches_compute_rdp(seed):
    pairs = _random_pairs(seed, 6) + [(0.01, 1.0), (0.3, 0.6)]
    orders = RDPAccountant.DEFAULT_ALPHAS
    ours = poisson_gaussian_rdp(
        [q for q, _ in pairs], [s for _, s in pairs], orders, series="opacus"
    )
    for k, (q, sigma) in enumerate(pairs):
        ref = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(orders))
        assert np.all(np.abs(ours[k] - ref) <= RTOL * np.abs(ref) + _opacus_atol(orders)), (q, sigma)


def test_special_cases_follow_the_references():
    orders = [1.5, 2.0, 10.0, math.inf]
    ours = poisson_gaussian_rdp([0.0, 0.2, 1.0, 0.0], [1.0, 0.0, 2.0, 0.0], orders)
    np.testing.assert_array_equal(ours[0], [0.0, 0.0, 0.0, 0.0])  # q = 0
    assert np.all(np.isinf(ours[1]))  # sigma = 0
    np.testing.assert_allclose(ours[2][:3], np.array(orders[:3]) / 8.0, rtol=1e-15)  # q = 1
    assert math.isinf(ours[2][3])
    np.testing.assert_array_equal(ours[3], 0.0)
    finite = [1.5, 2.0, 10.0]
    for q, sigma, row in [(0.2, 0.0, ours[1]), (1.0, 2.0, ours[2])]:
        np.testing.assert_allclose(row[:3], _reference([(q, sigma)], finite).rdp, rtol=1e-15)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(sample_rates=[0.1, 0.2], noise_multipliers=[1.0], orders=[2.0]), "same length"),
        (dict(sample_rates=[1.5], noise_multipliers=[1.0], orders=[2.0]), "sample_rates"),
        (dict(sample_rates=[0.1], noise_multipliers=[-1.0], orders=[2.0]), "noise_multipliers"),
        (dict(sample_rates=[0.1], noise_multipliers=[1.0], orders=[1.0]), "orders"),
        (dict(sample_rates=[0.1], noise_multipliers=[1.0], orders=[2.0], series="tf"), "series"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        poisson_gaussian_rdp(**kwargs)


def test_composed_rdp_sums_repeated_pairs_like_the_accountant():
    history = [(1.0, 0.01, 3), (2.0, 0.05, 0), (0.8, 0.02, 5), (1.0, 0.01, 4)]
    ref = _reference([(0.01, 1.0), (0.02, 0.8), (0.01, 1.0)], DEFAULT_RDP_ORDERS, [3, 5, 4]).rdp
    np.testing.assert_allclose(
        composed_rdp(history, DEFAULT_RDP_ORDERS), ref, rtol=RTOL, atol=12 * ATOL
    )


def test_composed_rdp_of_more_pairs_than_it_keeps(monkeypatch):
    """A run with more distinct pairs than the process keeps, one of them kept from an
    earlier call: the kept rows are cleared for the new ones, and the value is still the
    accountant's (it raised KeyError when the cleared pair was looked up)."""
    from opacus_lastiterate.analysis.baselines import subsampled_gaussian_rdp as module

    monkeypatch.setattr(module, "_CACHE_PAIRS", 4)
    monkeypatch.setattr(module, "_cache", {})
    composed_rdp([(1.0, 0.01, 2)], DEFAULT_RDP_ORDERS)  # (1.0, 0.01) kept
    history = [(1.0 + k / 10, 0.01, 1) for k in range(6)]  # (1.0, 0.01) among 6 pairs
    ref = _reference([(q, s) for s, q, _ in history], DEFAULT_RDP_ORDERS).rdp
    for _ in range(2):  # cleared, then not kept (more pairs than the bound)
        got = composed_rdp(history, DEFAULT_RDP_ORDERS)
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=6 * ATOL)


@pytest.mark.parametrize("seed", [4, 5])
def test_rdp_composition_matches_the_accountant_on_changing_noise(seed):
    rng = np.random.default_rng(seed)
    steps = 25
    sigmas = 0.6 + 2.0 * rng.random(steps)
    rates = 10 ** rng.uniform(-3, -1, steps)
    history = [(float(s), float(q), int(rng.integers(1, 4))) for s, q in zip(sigmas, rates)]
    reference = _reference([(q, s) for s, q, _ in history], DEFAULT_RDP_ORDERS,
                           [n for _, _, n in history])
    model = RDPComposition(DPSGDRun.from_history(history))
    for delta in (1e-5, 1e-8):
        assert model.epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=RTOL)
    for eps in (1.0, 4.0):
        assert model.delta(eps) == pytest.approx(reference.get_delta(eps), rel=RTOL)


def test_rdp_composition_at_chosen_orders_matches_the_accountant():
    history = [(0.999**t, 0.01, 1) for t in range(40)]
    orders = [1.25, 1.75, 2.0, 3.5, 8.0, 16.0, 64.0]
    reference = _reference([(q, s) for s, q, _ in history], orders)
    model = RDPComposition(DPSGDRun.from_history(history), orders=orders)
    assert model.epsilon(1e-5) == pytest.approx(reference.get_epsilon(1e-5), rel=RTOL)


def _random_triples(seed, n):
    """(q, sigma, fractional order) drawn over q in [1e-4, 0.5] (log-uniform), sigma in
    [0.1, 5] and orders in (1.01, 20) (a - 1 log-uniform: the orders near 1, whose series are
    the longest, as often as the large ones), a tenth of them on Opacus's grid 1.1 ... 10.9."""
    rng = np.random.default_rng(seed)
    triples = []
    for _ in range(n):
        q = float(10 ** rng.uniform(-4, math.log10(0.5)))
        sigma = float(rng.uniform(0.1, 5.0))
        if rng.random() < 0.1:
            order = 1 + int(rng.integers(1, 100)) / 10.0
            order = order if order != int(order) else order + 0.5
        else:
            order = 1.0 + float(10 ** rng.uniform(-2, math.log10(19.0)))
            order = order if order != int(order) else order + 0.25
        triples.append((q, sigma, order))
    return triples + [(0.5, 0.1, 1.5), (1e-4, 5.0, 1.01), (0.5, 5.0, 19.9), (1e-4, 0.1, 2.5)]


@pytest.mark.parametrize("seed", [6, 7])
def test_opacus_series_matches_opacus_on_random_triples(seed):
    # Opacus's own one-order, one-pair function, against ours one triple at a time and
    # all of them in one call (pairs x orders; the diagonal is each triple).
    from opacus.accountants.analysis.rdp import _compute_rdp

    triples = _random_triples(seed, 30)
    ref = np.array([_compute_rdp(q, sigma, order) for q, sigma, order in triples])
    one = np.array([
        poisson_gaussian_rdp([q], [sigma], [order], series="opacus")[0, 0]
        for q, sigma, order in triples
    ])
    rates, sigmas, orders = (list(column) for column in zip(*triples, strict=True))
    together = np.diag(poisson_gaussian_rdp(rates, sigmas, orders, series="opacus"))
    atol = _opacus_atol(orders)
    for ours in (one, together):
        assert np.all(np.abs(ours - ref) <= RTOL * np.abs(ref) + atol), triples


def _exact_log_a(q, sigma, order):
    """log A_a by 30-digit quadrature of E_{z ~ N(0, sigma^2)}[((1 - q) + q exp((2z - 1) /
    (2 sigma^2)))^a] (the definition, not the series)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 30
    q, s, a = mpmath.mpf(q), mpmath.mpf(sigma), mpmath.mpf(order)

    def integrand(z):
        ratio = (1 - q) + q * mpmath.exp((2 * z - 1) / (2 * s**2))
        return mpmath.npdf(z, 0, s) * ratio**a

    z0 = s**2 * mpmath.log(1 / q - 1) + mpmath.mpf(1) / 2
    points = [-mpmath.inf, -10 * s, 0, z0, z0 + 10 * s, mpmath.inf]
    return float(mpmath.log(mpmath.quad(integrand, points)))


@pytest.mark.parametrize(
    "q, sigma, order",
    [(0.0435, 0.5, 1.1), (0.0435, 0.3, 1.5), (0.01, 1.0, 2.5), (0.2, 0.8, 1.3),
     (0.0435, 0.135, 1.1), (0.001, 2.0, 4.7)],
)  # fmt: skip
def test_opacus_series_sums_the_whole_tail(q, sigma, order):
    """The fractional orders where Opacus's series is longest (its tail falls like
    i^-(a + 2)): ours is the whole series' sum, log(A) within 1e-15 of the integral; Opacus
    stops at its first term below e^-30 and lies within 5e-13 of it."""
    from opacus.accountants.analysis.rdp import _compute_log_a

    exact = _exact_log_a(q, sigma, order)
    ours = poisson_gaussian_rdp([q], [sigma], [order], series="opacus")[0, 0] * (order - 1)
    assert abs(ours - exact) <= 1e-15
    assert abs(_compute_log_a(q, sigma, order) - exact) <= OPACUS_LOG_A


def test_a_high_custom_order_opacus_stops_too_early_for_is_summed_whole():
    """q = 0.5, sigma = 1e4, a = 63.5: both halves of Opacus's first term are below e^-30,
    its series stops there and its RDP is negative; ours sums the whole series, which lies
    between the RDP at the integer orders around it (RDP is non-decreasing in a)."""
    from opacus.accountants.analysis.rdp import _compute_rdp

    assert _compute_rdp(0.5, 1e4, 63.5) < 0  # Opacus's value
    low, mid, high = poisson_gaussian_rdp([0.5], [1e4], [63.0, 63.5, 64.0], series="opacus")[0]
    assert 0 < low <= mid <= high
