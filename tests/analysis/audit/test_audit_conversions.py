"""Pure (eps, delta) and Gaussian-DP conversions against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    epsilon_bound_from_counts,
    epsilon_from_error_rates,
    gaussian_dp_estimate_from_counts,
)
from opacus_lastiterate.analysis.audit.gaussian_dp import gdp_mu


def direct_pure(fpr: float, fnr: float, delta: float) -> float:
    """max(log((1-d-a)/b), log((1-d-b)/a), 0), written out."""
    vals = [0.0]
    if 1 - delta - fpr > 0 and fnr > 0:
        vals.append(math.log((1 - delta - fpr) / fnr))
    if 1 - delta - fnr > 0 and fpr > 0:
        vals.append(math.log((1 - delta - fnr) / fpr))
    return max(vals)


@pytest.mark.parametrize(
    "fpr,fnr,delta",
    [
        (0.01, 0.2, 0.0),
        (0.2, 0.01, 1e-5),
        (0.3, 0.4, 0.0),
        (0.6, 0.6, 0.0),
        (0.05, 0.05, 0.1),
        (1e-6, 0.5, 1e-6),
    ],
)
def test_pure_conversion_formula(fpr: float, fnr: float, delta: float) -> None:
    assert epsilon_from_error_rates(fpr, fnr, delta=delta) == pytest.approx(
        direct_pure(fpr, fnr, delta), rel=1e-12
    )


def test_pure_conversion_edge_cases_and_arrays() -> None:
    assert (
        epsilon_from_error_rates(0.0, 0.5, delta=0.0) == math.inf
    )  # a perfect-FPR test at FNR 1/2
    assert epsilon_from_error_rates(0.0, 1.0, delta=0.0) == 0.0  # the trivial "always out" test
    a = np.array([0.01, 0.3, 0.6])
    b = np.array([0.2, 0.4, 0.6])
    out = epsilon_from_error_rates(a, b, delta=0.0)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [direct_pure(x, y, 0.0) for x, y in zip(a, b)], rtol=1e-12)


def test_pure_bound_from_counts_is_cp_then_conversion() -> None:
    fp, n_out, fn, n_in, d, c = 3, 500, 40, 400, 1e-5, 0.95
    a = stats.beta.ppf(1 - (1 - c) / 2, fp + 1, n_out - fp)
    b = stats.beta.ppf(1 - (1 - c) / 2, fn + 1, n_in - fn)
    res = epsilon_bound_from_counts(fp, n_out, fn, n_in, delta=d, confidence=c)
    assert res.epsilon == pytest.approx(direct_pure(a, b, d), rel=1e-9)
    assert res.kind == "bound" and res.method == "clopper-pearson"
    assert (
        res.counts.false_positives,
        res.counts.num_out,
        res.counts.false_negatives,
        res.counts.num_in,
    ) == (fp, n_out, fn, n_in)


@pytest.mark.parametrize(
    "n,expected",
    [(50, 2.570), (100, 3.281), (250, 4.209), (500, 4.906), (1000, 5.601), (5000, 7.212)],
)
def test_pure_perfect_separation_anchor_table(n: int, expected: float) -> None:
    # docs/auditing.md, "Reference values": FP = FN = 0, 95%, delta = 1e-5.
    assert epsilon_bound_from_counts(0, n, 0, n, delta=1e-5).epsilon == pytest.approx(
        expected, abs=6e-4
    )


def test_gdp_mu_formula() -> None:
    for a, b in [(0.01, 0.2), (0.2, 0.01), (0.3, 0.3), (0.6, 0.7)]:
        expected = max(0.0, stats.norm.ppf(1 - a) - stats.norm.ppf(b))
        assert float(gdp_mu(np.array(a), np.array(b))) == pytest.approx(
            expected, rel=1e-12, abs=1e-15
        )
    assert gdp_mu(np.array(0.6), np.array(0.7)) == 0.0  # negative evidence is clamped, not mirrored


def test_gdp_estimate_from_counts_is_labelled() -> None:
    res = gaussian_dp_estimate_from_counts(0, 50, 0, 50, delta=1e-5)
    # docs/auditing.md, "Reference values": mu_lb = 2.9350, eps_GDP = 16.21 at n = 50 per side.
    assert res.mu == pytest.approx(2.9350, abs=1e-4)
    assert res.epsilon == pytest.approx(16.21, abs=6e-3)
    assert res.kind == "estimate" and not res.is_bound
    assert "ESTIMATE" in str(res) and "Gaussian" in str(res)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda: epsilon_from_error_rates(1.5, 0.1, delta=0.0),
            ValueError,
            r"`false_positive_rate` must be in \[0, 1\], got 1.5\.",
        ),
        (
            lambda: epsilon_from_error_rates(0.1, 0.1, delta=1.0),
            ValueError,
            r"`delta` must be in \[0, 1\), got 1.0\.",
        ),
        (
            lambda: epsilon_from_error_rates(0.1, np.array([0.1, -0.1]), delta=0.0),
            ValueError,
            "`false_negative_rate` must have every entry",
        ),
        (
            lambda: epsilon_bound_from_counts(5, 4, 0, 4, delta=0.0),
            ValueError,
            r"`false_positives` must be in \[0, 4\], got 5\.",
        ),
        (
            lambda: epsilon_bound_from_counts(0, 0, 0, 4, delta=0.0),
            ValueError,
            r"`num_out` must be an integer >= 1, got 0\.",
        ),
        (
            lambda: gaussian_dp_estimate_from_counts(0, 4, 0, 4, delta=1e-5, confidence=1.0),
            ValueError,
            r"`confidence` must be in \(0, 1\), got 1.0\.",
        ),
    ],
)
def test_validation_messages(call, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
