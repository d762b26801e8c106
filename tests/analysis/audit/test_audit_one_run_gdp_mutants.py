"""Tests written for the mutants of the one-run, f-DP one-run and Gaussian-DP audits that the
other audit tests let survive (``scripts/mutation.py one_run one_run_fdp gaussian_dp``).

Every expected number comes from a computation written here: binomial sums with
``math.comb`` for the one-run p-value, the closed form of the one-run bound when every guess
is right, the f-DP recursion written from its definition (no early stop) with the trade-off
curves written from theirs, and ``scipy.stats.norm`` for Gaussian-DP. The refusals are
checked for the parameter they name; the results for their labels.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import numpy as np
import pytest
from scipy.stats import norm

from opacus_lastiterate.analysis.audit.gaussian_dp import (
    GDP_ESTIMATE_NOTE,
    gaussian_dp_estimate_from_counts,
    gdp_mu,
)
from opacus_lastiterate.analysis.audit.one_run import (
    ONE_RUN_DELTA_WARNING_LEVEL,
    one_run_epsilon_bound,
    p_value,
)
from opacus_lastiterate.analysis.audit.one_run_fdp import (
    FDP_GAUSSIAN_NOTE,
    g_function,
    one_run_fdp_bound,
    rejects,
)
from opacus_lastiterate.analysis.audit.result import MultiRunCounts, OneRunCounts
from opacus_lastiterate.exceptions import NonRandomizedInclusionWarning, OneRunDeltaWarning


def one_run_p_value(m: int, r: int, v: int, *, epsilon: float, delta: float) -> float:
    """The p-value the one-run bound inverts (``p_value``), called as the tests read it."""
    return p_value(m, r, v, epsilon, delta)


def one_run_fdp_rejects(m, r, v, *, family, parameter, delta=0.0, confidence=0.95) -> bool:
    """The f-DP one-run test that ``one_run_fdp_bound`` inverts (``rejects`` of the claim's
    trade-off function), called as the tests read it."""
    return rejects(m, r, v, 1.0 - confidence, g_function(family, parameter, delta))


ONE_RUN_SELECTION = "guesses fixed without looking at the inclusion coins"
NON_RANDOM_TEXT = (
    "canary inclusion was not randomised by independent fair coins: the one-run bound "
    "is not valid for a fixed in/out split."
)


@contextlib.contextmanager
def no_warnings():
    """A context in which any warning is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# --- one-run p-value and bound (Steinke, Nasr, Jagielski, arXiv:2305.08846) -------------


def binomial_pmf(k: int, r: int, p: float) -> float:
    return math.comb(r, k) * p**k * (1.0 - p) ** (r - k)


def reference_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The module's formula written out: beta + 2 m delta alpha, clipped at 1."""
    if v == 0:
        return 1.0
    p = math.exp(eps) / (1.0 + math.exp(eps))
    beta = sum(binomial_pmf(k, r, p) for k in range(v, r + 1))
    alpha = max(
        sum(binomial_pmf(k, r, p) for k in range(v - i, v)) / i for i in range(1, v + 1)
    )
    return min(1.0, beta + 2.0 * m * delta * alpha)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [
        (10, 1, 1, 0.7, 0.0),
        (10, 1, 1, 0.7, 1e-3),
        (50, 8, 1, 0.3, 1e-4),
        (50, 8, 6, 1.2, 1e-4),
        (200, 30, 25, 1.5, 1e-5),
        (200, 30, 30, 2.0, 0.0),
        (20, 5, 0, 1.0, 1e-3),
    ],
)
def test_one_run_p_value_matches_binomial_sums(m, r, v, eps, delta):
    got = one_run_p_value(m, r, v, epsilon=eps, delta=delta)
    assert isinstance(got, float)
    assert got == pytest.approx(reference_p_value(m, r, v, eps, delta), rel=1e-10, abs=1e-15)


def test_one_run_p_value_of_one_correct_guess_is_the_guess_probability():
    # r = v = 1, delta = 0: Pr[the one guess is right] = e^eps / (1 + e^eps)
    assert one_run_p_value(5, 1, 1, epsilon=1.0, delta=0.0) == pytest.approx(
        math.e / (1.0 + math.e), rel=1e-12
    )


def closed_form_all_correct(r: int, confidence: float) -> float:
    """v = r, delta = 0: largest eps with (e^eps / (1 + e^eps))^r < 1 - confidence."""
    q = (1.0 - confidence) ** (1.0 / r)
    return math.log(q / (1.0 - q))


@pytest.mark.parametrize(("r", "confidence"), [(10, 0.95), (40, 0.9), (100, 0.99)])
def test_one_run_bound_matches_closed_form_when_every_guess_is_right(r, confidence):
    res = one_run_epsilon_bound(10 * r, r, r, delta=0.0, confidence=confidence)
    assert res.epsilon == pytest.approx(closed_form_all_correct(r, confidence), rel=1e-8)


def test_one_run_bound_default_confidence_is_095_and_labels():
    with no_warnings():
        res = one_run_epsilon_bound(400, 20, 20, delta=0.0)
    assert res.epsilon == pytest.approx(closed_form_all_correct(20, 0.95), rel=1e-8)
    assert res.delta == 0.0
    assert res.confidence == 0.95
    assert res.method == "one-run"
    assert res.kind == "bound"
    assert res.statistically_valid is True
    assert res.counts == OneRunCounts(400, 20, 20)
    assert res.selection == ONE_RUN_SELECTION
    assert res.notes == ()


def test_one_run_bound_with_delta_is_the_largest_rejected_epsilon():
    m, r, v, delta, c = 1000, 60, 55, 1e-6, 0.95
    res = one_run_epsilon_bound(m, r, v, delta=delta, confidence=c)
    assert res.delta == delta
    assert reference_p_value(m, r, v, res.epsilon * (1 - 1e-7), delta) < 1 - c
    assert reference_p_value(m, r, v, res.epsilon * (1 + 1e-7) + 1e-9, delta) >= 1 - c


def test_one_run_bound_not_randomised_is_invalid_with_its_note():
    with pytest.warns(NonRandomizedInclusionWarning) as rec:
        res = one_run_epsilon_bound(100, 10, 10, delta=0.0, inclusion_randomized=False)
    assert str(rec[0].message) == NON_RANDOM_TEXT
    assert res.kind == "invalid"
    assert res.statistically_valid is False
    assert res.notes == (NON_RANDOM_TEXT,)


def test_one_run_delta_warning_text_and_note():
    m, delta = 10, 0.01  # 2 m delta = 0.2
    with pytest.warns(OneRunDeltaWarning) as rec:
        res = one_run_epsilon_bound(m, 5, 5, delta=delta)
    msg = str(rec[0].message)
    assert msg.startswith("2 * m * delta = 0.2 is not small (m = 10, delta = 0.01); ")
    assert msg.endswith(
        "the delta term weakens the one-run bound. Use fewer canaries or a smaller delta."
    )
    assert res.notes == (msg,)


def test_one_run_delta_warning_only_strictly_above_the_level():
    # 2 m delta exactly at the level, and 3 m delta above it: no warning
    m = 5
    delta = ONE_RUN_DELTA_WARNING_LEVEL / (2.0 * m)
    assert 2.0 * m * delta == ONE_RUN_DELTA_WARNING_LEVEL
    with no_warnings():
        at = one_run_epsilon_bound(m, 5, 5, delta=delta)
        below = one_run_epsilon_bound(m, 5, 5, delta=0.8 * delta)
    assert at.notes == () and below.notes == ()


def test_one_run_bound_refusals_name_their_parameter():
    with pytest.raises(ValueError, match="`num_canaries` must be an integer >= 1"):
        one_run_epsilon_bound(0, 0, 0, delta=0.0)
    with pytest.raises(TypeError, match="`num_guesses`"):
        one_run_epsilon_bound(10, 2.0, 1, delta=0.0)
    with pytest.raises(TypeError, match="`num_correct`"):
        one_run_epsilon_bound(10, 2, 1.0, delta=0.0)
    for bad in (1.0, 1.5):
        with pytest.raises(ValueError, match="`delta`"):
            one_run_epsilon_bound(10, 2, 1, delta=bad)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="`confidence`"):
            one_run_epsilon_bound(10, 2, 1, delta=0.0, confidence=bad)
    with pytest.raises(TypeError, match="`inclusion_randomized` must be a bool"):
        one_run_epsilon_bound(10, 2, 1, delta=0.0, inclusion_randomized=1)


def test_one_run_minimum_counts_accepted():
    with no_warnings():
        res = one_run_epsilon_bound(1, 0, 0, delta=0.0, confidence=0.5)
    assert res.epsilon == 0.0
    assert one_run_p_value(1, 0, 0, epsilon=0.0, delta=0.0) == 1.0


# --- f-DP one-run (Mahloujifar, Melis, Chaudhuri, arXiv:2410.22235) ----------------------


def tradeoff_epsilon_delta(alpha: float, eps: float, delta: float) -> float:
    """f_{eps,delta}(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha))."""
    return max(
        0.0, 1.0 - delta - math.exp(eps) * alpha, math.exp(-eps) * (1.0 - delta - alpha)
    )


def tradeoff_gaussian(alpha: float, mu: float) -> float:
    """f_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu)."""
    return float(norm.cdf(norm.ppf(1.0 - alpha) - mu))


def reference_margin(m: int, r: int, v: int, significance: float, f) -> float:
    """r_0 + h_0 - r / m of the recursion, every step taken (no early stop)."""
    if v == 0:
        return -math.inf
    rr = significance * v / m
    h = significance * (r - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, f(1.0 - rr))
        rr = min(1.0, rr + i / (r - i) * (h_new - h))
        h = h_new
    return rr + h - r / m


CLAIMS = [
    ("epsilon-delta", 0.0, 0.0),
    ("epsilon-delta", 0.5, 0.0),
    ("epsilon-delta", 1.0, 1e-3),
    ("epsilon-delta", 2.0, 1e-2),
    ("epsilon-delta", 3.0, 0.05),
    ("gaussian", 0.0, 0.0),
    ("gaussian", 0.8, 0.0),
    ("gaussian", 2.0, 0.0),
]
COUNTS = [(1, 1, 1), (4, 2, 1), (4, 4, 3), (20, 10, 9), (50, 50, 45), (100, 100, 100)]


def fdp_curve(family: str, param: float, delta: float):
    if family == "gaussian":
        return lambda a: tradeoff_gaussian(a, param)
    return lambda a: tradeoff_epsilon_delta(a, param, delta)


def test_fdp_rejects_matches_the_recursion_on_a_grid():
    seen = {True: 0, False: 0}
    for family, param, delta in CLAIMS:
        for m, r, v in COUNTS:
            for confidence in (0.3, 0.6, 0.9, 0.95):
                f = fdp_curve(family, param, delta)
                margin = reference_margin(m, r, v, 1.0 - confidence, f)
                if abs(margin) < 1e-9:
                    continue
                got = one_run_fdp_rejects(
                    m, r, v, family=family, parameter=param, delta=delta, confidence=confidence
                )
                assert got is (margin > 0), (family, param, delta, m, r, v, confidence)
                seen[got] += 1
    assert seen[True] > 20 and seen[False] > 20


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 0.0), (1.5, 0.02), (2.5, 0.01)])
def test_fdp_rejects_where_the_steep_part_of_the_curve_decides(eps, delta):
    # all 100 guesses right: the recursion reaches the part 1 - delta - e^eps alpha of f;
    # the claim at the recursion's own supremum is checked on both sides
    m = r = v = 100
    sig = 0.05

    def margin(e: float) -> float:
        return reference_margin(m, r, v, sig, lambda a: tradeoff_epsilon_delta(a, e, delta))

    lo, hi = 0.0, 50.0
    assert margin(lo) > 0 > margin(hi)
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if margin(mid) > 0 else (lo, mid)
    kw = dict(family="epsilon-delta", delta=delta, confidence=0.95)
    assert one_run_fdp_rejects(m, r, v, parameter=lo * (1 - 1e-6), **kw)
    assert not one_run_fdp_rejects(m, r, v, parameter=hi * (1 + 1e-6), **kw)
    res = one_run_fdp_bound(m, r, v, delta=delta)
    assert res.epsilon == pytest.approx(lo, rel=1e-7)


def test_fdp_single_guess_tie_is_not_rejected():
    # eps = 0, one right guess of one, significance 0.5: r_0 + h_0 = 0.5 + 0.5 = r / m exactly,
    # and the p-value of a coin flip (1/2) is not below 1/2
    for family in ("epsilon-delta", "gaussian"):
        assert not one_run_fdp_rejects(1, 1, 1, family=family, parameter=0.0, confidence=0.5)
        assert one_run_fdp_rejects(1, 1, 1, family=family, parameter=0.0, confidence=0.4)


def test_fdp_claims_with_huge_epsilon_are_never_rejected():
    for eps in (700.0, 800.0, 1e4):
        for m, r, v in [(1, 1, 1), (100, 100, 100), (1000, 500, 500)]:
            assert not one_run_fdp_rejects(
                m, r, v, family="epsilon-delta", parameter=eps, delta=1e-3, confidence=0.999
            )


def test_fdp_bound_labels_epsilon_delta():
    with no_warnings():
        res = one_run_fdp_bound(200, 40, 38, delta=1e-5)
    assert res.method == "one-run-fdp (epsilon-delta)"
    assert res.kind == "bound"
    assert res.mu is None
    assert res.statistically_valid is True
    assert res.counts == OneRunCounts(200, 40, 38)
    assert res.selection == ONE_RUN_SELECTION
    assert res.notes == ()
    assert res.delta == 1e-5 and res.confidence == 0.95


def test_fdp_bound_labels_gaussian():
    with no_warnings():
        res = one_run_fdp_bound(200, 40, 38, delta=1e-5, family="gaussian")
    assert res.method == "one-run-fdp (gaussian)"
    assert res.kind == "estimate"
    assert res.mu > 0
    assert res.counts == OneRunCounts(200, 40, 38)
    assert res.selection == ONE_RUN_SELECTION
    assert res.notes == (FDP_GAUSSIAN_NOTE,)


def test_fdp_bound_not_randomised_keeps_the_note_in_both_families():
    for family, first in (("epsilon-delta", ()), ("gaussian", (FDP_GAUSSIAN_NOTE,))):
        with pytest.warns(NonRandomizedInclusionWarning):
            res = one_run_fdp_bound(
                100, 20, 20, delta=1e-5, family=family, inclusion_randomized=False
            )
        assert res.kind == "invalid"
        assert res.statistically_valid is False
        assert res.notes == first + (NON_RANDOM_TEXT,)


def test_fdp_bound_refusals_name_their_parameter():
    with pytest.raises(ValueError, match="`delta`"):
        one_run_fdp_bound(10, 5, 5, delta=0.0, family="gaussian")
    with no_warnings():
        assert one_run_fdp_bound(10, 5, 5, delta=0.0).epsilon >= 0.0
    for bad in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="`delta`"):
            one_run_fdp_bound(10, 5, 5, delta=bad)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="`confidence`"):
            one_run_fdp_bound(10, 5, 5, delta=1e-5, confidence=bad)
    with pytest.raises(TypeError, match="`inclusion_randomized` must be a bool"):
        one_run_fdp_bound(10, 5, 5, delta=1e-5, inclusion_randomized="yes")


# --- Gaussian DP (Dong, Roth, Su, arXiv:1905.02383) ---------------------------------------


def test_gdp_mu_degenerate_tests_give_zero_without_warnings():
    # always "out" (FPR 0, FNR 1) and always "in" (FPR 1, FNR 0): no evidence, mu = 0
    with no_warnings():
        np.testing.assert_array_equal(
            gdp_mu(np.array([0.0, 1.0, 0.5]), np.array([1.0, 0.0, 0.5])), [0.0, 0.0, 0.0]
        )


def test_gdp_estimate_labels_and_minimum_counts():
    with no_warnings():
        res = gaussian_dp_estimate_from_counts(0, 1, 0, 1, delta=1e-5)
    assert res.counts == MultiRunCounts(1, 1, 0, 0)
    assert res.method == "gaussian-dp"
    assert res.kind == "estimate"
    assert res.selection == "counts of one test fixed in advance"
    assert res.notes == (GDP_ESTIMATE_NOTE,)
    assert res.confidence == 0.95 and res.delta == 1e-5
    # one run each way: the Clopper-Pearson upper bounds of 0 out of 1 are 0.975, mu is 0
    assert res.mu == 0.0


def test_gdp_estimate_from_zero_errors_matches_closed_forms():
    # 0 errors out of n: Clopper-Pearson upper bound 1 - s^(1/n) at significance s
    n, delta, c = 200, 1e-5, 0.9
    s = (1.0 - c) / 2.0
    ub = 1.0 - s ** (1.0 / n)
    mu = norm.isf(ub) - norm.ppf(ub)
    res = gaussian_dp_estimate_from_counts(0, n, 0, n, delta=delta, confidence=c)
    assert res.mu == pytest.approx(mu, rel=1e-9)
    eps = res.epsilon
    # Dong, Roth, Su Cor. 2.13 at the returned epsilon gives back delta
    d = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    assert d == pytest.approx(delta, rel=1e-6)


def test_gdp_estimate_refusals_name_their_parameter():
    with pytest.raises(ValueError, match="`num_out` must be an integer >= 1"):
        gaussian_dp_estimate_from_counts(0, 0, 0, 5, delta=1e-5)
    with pytest.raises(ValueError, match="`num_in` must be an integer >= 1"):
        gaussian_dp_estimate_from_counts(0, 5, 0, 0, delta=1e-5)
    with pytest.raises(TypeError, match="`num_out`"):
        gaussian_dp_estimate_from_counts(0, 5.0, 0, 5, delta=1e-5)
    with pytest.raises(TypeError, match="`num_in`"):
        gaussian_dp_estimate_from_counts(0, 5, 0, 5.0, delta=1e-5)
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="`confidence`"):
            gaussian_dp_estimate_from_counts(0, 5, 0, 5, delta=1e-5, confidence=bad)


def test_fdp_test_does_not_reject_at_an_exact_tie() -> None:
    """eps = delta = 0 makes f(x) = 1 - x: with 1 guess of 1 correct out of m = 10 at
    confidence 0.5, the p-value equals the significance exactly, so the claim is not
    rejected (a rounding of the recursion's sums must not tip it to the unsafe side)."""

    assert not one_run_fdp_rejects(
        10, 1, 1, family="epsilon-delta", parameter=0.0, confidence=0.5
    )
