"""One-run bound (Steinke, Nasr, Jagielski 2023) against an independent evaluation."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    OneRunDeltaWarning,
    audit_one_run,
    one_run_epsilon_bound,
)
from opacus_lastiterate.analysis.audit.one_run import p_value
from opacus_lastiterate.exceptions import NonRandomizedInclusionWarning


def one_run_p_value(m: int, r: int, v: int, *, epsilon: float, delta: float) -> float:
    """The p-value the one-run bound inverts (``p_value``), called as the tests read it."""
    return p_value(m, r, v, epsilon, delta)


def direct_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The formula written out with exact binomial coefficients (small r only):
    beta = sum_{j >= v} C(r, j) p^j (1-p)^(r-j); alpha = max_i (1/i) sum_{j = v-i}^{v-1} pmf(j);
    p-value = min(1, beta + 2 m delta alpha), p = e^eps / (1 + e^eps)."""
    p = 1.0 / (1.0 + math.exp(-eps))
    pmf = [math.comb(r, j) * p**j * (1 - p) ** (r - j) for j in range(r + 1)]
    beta = sum(pmf[v:])
    alpha = 0.0
    for i in range(1, v + 1):
        alpha = max(alpha, sum(pmf[v - i : v]) / i)
    return min(1.0, beta + 2 * m * delta * alpha)


def scipy_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Same formula from scipy.stats.binom tails (for larger r)."""
    p = 1.0 / (1.0 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, p)
    i = np.arange(1, v + 1)
    window = stats.binom.cdf(v - 1, r, p) - stats.binom.cdf(v - i - 1, r, p)
    alpha = float(np.max(window / i)) if v > 0 else 0.0
    return min(1.0, beta + 2 * m * delta * alpha)


@pytest.mark.parametrize(
    "m,r,v", [(10, 5, 5), (100, 20, 17), (100, 40, 25), (1000, 60, 60), (50, 30, 0)]
)
@pytest.mark.parametrize("eps", [0.0, 0.5, 2.0, 5.0])
@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_p_value_matches_direct_formula(m: int, r: int, v: int, eps: float, delta: float) -> None:
    got = one_run_p_value(m, r, v, epsilon=eps, delta=delta)
    assert got == pytest.approx(direct_p_value(m, r, v, eps, delta), rel=1e-10, abs=1e-300)


@pytest.mark.parametrize(
    "m,r,v,delta",
    [(1000, 100, 90, 1e-5), (1000, 100, 100, 0.0), (10000, 1000, 850, 1e-6), (200, 100, 70, 1e-4)],
)
def test_bound_is_the_crossing_of_the_direct_p_value(m: int, r: int, v: int, delta: float) -> None:
    sig = 0.05
    res = one_run_epsilon_bound(m, r, v, delta=delta, confidence=1 - sig)
    eps = res.epsilon
    assert eps > 0
    # Largest eps with p-value < significance: p(eps) < sig <= p(eps + tol), from scipy tails.
    assert scipy_p_value(m, r, v, eps, delta) < sig
    assert scipy_p_value(m, r, v, eps + 1e-7, delta) >= sig
    assert res.kind == "bound" and res.is_bound


@pytest.mark.parametrize("r", [1, 10, 100, 1000, 5000])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_saturation_value_when_all_guesses_right(r: int, confidence: float) -> None:
    # delta = 0, v = r: p-value = p^r < a  <=>  eps < ln(a^(1/r) / (1 - a^(1/r))), a = 1 - confidence.
    a = 1 - confidence
    x = a ** (1 / r)
    expected = math.log(x / (1 - x))
    if expected <= 0:
        expected = 0.0
    got = one_run_epsilon_bound(10 * r, r, r, delta=0.0, confidence=confidence).epsilon
    assert got == pytest.approx(expected, abs=1e-8)


@pytest.mark.parametrize(
    "m,r,e0,e5",
    [
        (100, 100, 3.4930, 3.4902),
        (1000, 100, 3.4930, 3.4654),
        (1000, 1000, 5.8091, 5.7823),
        (10000, 1000, 5.8091, 5.5293),
    ],
)
def test_anchor_table_all_correct(m: int, r: int, e0: float, e5: float) -> None:
    # docs/auditing.md, "Reference values" (one run, all guesses right).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OneRunDeltaWarning)
        assert one_run_epsilon_bound(m, r, r, delta=0.0).epsilon == pytest.approx(e0, abs=1e-4)
        assert one_run_epsilon_bound(m, r, r, delta=1e-5).epsilon == pytest.approx(e5, abs=1e-4)


@pytest.mark.parametrize(
    "v,expected",
    [
        (100, 3.4654),
        (99, 3.0028),
        (95, 2.1652),
        (90, 1.6261),
        (80, 0.9553),
        (70, 0.4691),
        (60, 0.0495),
    ],
)
def test_anchor_table_by_number_correct(v: int, expected: float) -> None:
    assert one_run_epsilon_bound(1000, 100, v, delta=1e-5).epsilon == pytest.approx(
        expected, abs=1e-4
    )


def test_p_value_increases_with_epsilon() -> None:
    # The eps search relies on it; checked on a grid with the direct formula's own values too.
    rng = np.random.default_rng(0)
    for _ in range(40):
        r = int(rng.integers(1, 80))
        v = int(rng.integers(0, r + 1))
        m = int(rng.integers(r, 10**5))
        d = float(10 ** rng.uniform(-8, -2))
        ps = [one_run_p_value(m, r, v, epsilon=e, delta=d) for e in np.linspace(0, 12, 121)]
        assert np.all(np.diff(ps) >= -1e-12)


def test_warnings() -> None:
    with pytest.warns(OneRunDeltaWarning, match=r"2 \* m \* delta = 0.2"):
        one_run_epsilon_bound(10000, 100, 90, delta=1e-5)
    with pytest.warns(NonRandomizedInclusionWarning):
        res = one_run_epsilon_bound(100, 50, 50, delta=0.0, inclusion_randomized=False)
    assert not res.statistically_valid and res.kind == "invalid"
    assert str(res).startswith("NOT A VALID BOUND")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one_run_epsilon_bound(1000, 100, 90, delta=1e-5)  # 2 m delta = 0.02: no warning
    rng = np.random.default_rng(0)
    with pytest.warns(NonRandomizedInclusionWarning):
        audit_one_run(
            rng.normal(1, 1, 50), rng.normal(0, 1, 50), delta=0.0, inclusion_randomized=False
        )


def test_warning_subclasses_are_filterable() -> None:
    from opacus_lastiterate.analysis.audit import AuditWarning

    assert issubclass(OneRunDeltaWarning, AuditWarning) and issubclass(AuditWarning, UserWarning)
    assert issubclass(NonRandomizedInclusionWarning, AuditWarning)


def test_score_audit_with_explicit_threshold_equals_counts() -> None:
    from opacus_lastiterate.analysis.audit import ExplicitThreshold

    rng = np.random.default_rng(1)
    ins, outs = rng.normal(3, 1, 300), rng.normal(0, 1, 300)
    t = 2.0
    r = int(np.sum(ins >= t) + np.sum(outs >= t))
    v = int(np.sum(ins >= t))
    res = audit_one_run(ins, outs, delta=1e-6, threshold_strategy=ExplicitThreshold(t))
    assert res.epsilon == one_run_epsilon_bound(600, r, v, delta=1e-6).epsilon
    assert (res.counts.num_canaries, res.counts.num_guesses, res.counts.num_correct) == (600, r, v)


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: one_run_epsilon_bound(10, 11, 5, delta=0.0),
            r"`num_guesses` must be in \[0, 10\], got 11\.",
        ),
        (
            lambda: one_run_epsilon_bound(10, 5, 6, delta=0.0),
            r"`num_correct` must be in \[0, 5\], got 6\.",
        ),
        (
            lambda: one_run_epsilon_bound(10, 5, 5, delta=1.0),
            r"`delta` must be in \[0, 1\), got 1.0\.",
        ),
        (
            lambda: one_run_epsilon_bound(0, 0, 0, delta=0.0),
            r"`num_canaries` must be an integer >= 1, got 0\.",
        ),
        (
            lambda: one_run_epsilon_bound(10, 5, 5, delta=0.0, confidence=2),
            r"`confidence` must be in \(0, 1\), got 2\.",
        ),
    ],
)
def test_validation_messages(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pruned_search_over_thresholds_equals_brute_force(seed: int) -> None:
    from opacus_lastiterate.analysis.audit import Bonferroni, RankGridBonferroni

    rng = np.random.default_rng(seed)
    ins, outs = rng.normal(1.5, 1, 70), rng.normal(0, 1, 80)
    m, d = 150, 1e-4
    pooled = np.concatenate([ins, outs])

    def brute(thresholds, confidence: float) -> float:
        best = 0.0
        for t in thresholds:
            r, v = int(np.sum(pooled >= t)), int(np.sum(ins >= t))
            best = max(best, one_run_epsilon_bound(m, r, v, delta=d, confidence=confidence).epsilon)
        return best

    got = audit_one_run(ins, outs, delta=d, threshold_strategy=Bonferroni()).epsilon
    assert got == pytest.approx(brute(pooled, 1 - 0.05 / m), abs=1e-9)
    ks = sorted({round(1.25**i) for i in range(40) if round(1.25**i) < m})  # top-k grid
    desc = np.sort(pooled)[::-1]
    got = audit_one_run(ins, outs, delta=d, threshold_strategy=RankGridBonferroni()).epsilon
    assert got == pytest.approx(brute(desc[np.array(ks) - 1], 1 - 0.05 / len(ks)), abs=1e-9)
