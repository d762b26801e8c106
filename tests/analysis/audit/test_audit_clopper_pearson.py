"""Clopper-Pearson bounds against scipy computed independently in the test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit.clopper_pearson import (
    clopper_pearson_lower,
    clopper_pearson_upper,
)

CASES = [
    (0, 1),
    (0, 10),
    (1, 10),
    (5, 10),
    (9, 10),
    (10, 10),
    (0, 1000),
    (3, 1000),
    (500, 1000),
    (999, 1000),
]
LEVELS = [0.5, 0.9, 0.95, 0.99, 1 - 1e-6]


@pytest.mark.parametrize("k,n", CASES)
@pytest.mark.parametrize("confidence", LEVELS)
def test_one_sided_bounds_match_beta_quantiles(k: int, n: int, confidence: float) -> None:
    # Definition: upper = Beta(k+1, n-k).ppf(c) (1 at k = n); lower = Beta(k, n-k+1).ppf(1-c) (0 at k = 0).
    expected_upper = 1.0 if k == n else stats.beta.ppf(confidence, k + 1, n - k)
    expected_lower = 0.0 if k == 0 else stats.beta.ppf(1 - confidence, k, n - k + 1)
    assert clopper_pearson_upper(k, n, confidence) == pytest.approx(
        expected_upper, rel=1e-9, abs=1e-14
    )
    assert clopper_pearson_lower(k, n, confidence) == pytest.approx(
        expected_lower, rel=1e-9, abs=1e-14
    )


@pytest.mark.parametrize("k,n", CASES)
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_matches_scipy_binomtest_exact(k: int, n: int, confidence: float) -> None:
    less = stats.binomtest(k, n, alternative="less").proportion_ci(
        confidence_level=confidence, method="exact"
    )
    greater = stats.binomtest(k, n, alternative="greater").proportion_ci(
        confidence_level=confidence, method="exact"
    )
    assert clopper_pearson_upper(k, n, confidence) == pytest.approx(less.high, rel=1e-9, abs=1e-14)
    assert clopper_pearson_lower(k, n, confidence) == pytest.approx(
        greater.low, rel=1e-9, abs=1e-14
    )


@pytest.mark.parametrize("n", [1, 7, 50, 1000, 10**6])
def test_zero_successes_closed_form(n: int) -> None:
    # UB(0, n, c) = 1 - (1 - c)^(1/n): solve (1 - p)^n = 1 - c.
    for c in (0.9, 0.975, 1 - 1e-8):
        assert clopper_pearson_upper(0, n, c) == pytest.approx(
            -np.expm1(np.log1p(-c) / n), rel=1e-9
        )


def test_tiny_significance_stays_accurate() -> None:
    # Bonferroni over many thresholds uses significances like 1e-13; the bound p must satisfy
    # Pr[Binomial(n, p) <= k] = significance (the CP duality), checked with scipy's binom.cdf.
    k, n, sig = 3, 5000, 1e-13
    p = clopper_pearson_upper(k, n, 1 - sig)
    assert stats.binom.cdf(k, n, p) == pytest.approx(sig, rel=1e-3)


def test_arrays_are_vectorised_and_shape_preserving() -> None:
    k = np.array([[0, 1], [2, 10]])
    up = clopper_pearson_upper(k, 10, 0.9)
    lo = clopper_pearson_lower(k, 10, 0.9)
    assert isinstance(up, np.ndarray) and up.shape == (2, 2)
    for idx in np.ndindex(k.shape):
        assert up[idx] == clopper_pearson_upper(int(k[idx]), 10, 0.9)
        assert lo[idx] == clopper_pearson_lower(int(k[idx]), 10, 0.9)
    assert isinstance(clopper_pearson_upper(np.int64(3), 10), float)


def test_coverage_of_upper_bound_by_simulation() -> None:
    # Pr[p > UB(K)] <= 1 - c for K ~ Binomial(n, p). Exact check by summing the binomial pmf
    # over the k whose bound falls below p (no sampling noise).
    n, c = 40, 0.9
    ubs = clopper_pearson_upper(np.arange(n + 1), n, c)
    for p in np.linspace(0.01, 0.99, 37):
        fail = stats.binom.pmf(np.arange(n + 1), n, p)[ubs < p].sum()
        assert fail <= 1 - c + 1e-12


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: clopper_pearson_upper(3, 10, 1.5), r"`confidence` must be in \(0, 1\), got 1.5\."),
        (lambda: clopper_pearson_upper(3, 10, 0.0), r"`confidence` must be in \(0, 1\), got 0.0\."),
        (
            lambda: clopper_pearson_upper(11, 10),
            r"`successes` must be an integer in \[0, 10\], got 11\.",
        ),
        (lambda: clopper_pearson_lower(-1, 10), r"`successes` must be an integer >= 0, got -1\."),
        (lambda: clopper_pearson_upper(1, 0), r"`trials` must be an integer >= 1, got 0\."),
        (
            lambda: clopper_pearson_upper(np.array([1, 12]), 10),
            r"`successes` must have every entry in \[0, 10\]",
        ),
    ],
)
def test_validation_messages(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_type_errors() -> None:
    with pytest.raises(TypeError, match="`successes` must be an integer"):
        clopper_pearson_upper(1.5, 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`trials` must be an integer"):
        clopper_pearson_upper(1, 10.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`successes` must be an integer"):
        clopper_pearson_upper(True, 10)  # type: ignore[arg-type]
