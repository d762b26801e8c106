"""The published maximum-over-thresholds statistic, recomputed independently, and its label."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats

from opacus_lastiterate.analysis.audit import (
    Bonferroni,
    ScoreAudit,
    published_gdp_epsilon,
    statistics_side_by_side,
)
from opacus_lastiterate.analysis.audit.published import PUBLISHED_LABEL


def reference(ins: np.ndarray, outs: np.ndarray, alpha: float, delta: float) -> float:
    """The published recipe written out threshold by threshold with scipy's own tools:
    a two-sided exact interval at level 1 - 2 alpha (its upper end is the one-sided bound at
    1 - alpha), mu from the two upper ends, the root of the GDP delta curve on [0, 50]."""
    best = None
    for t in np.unique(np.concatenate([ins, outs])):
        fp, fn = int(np.sum(outs >= t)), int(np.sum(ins < t))
        fpr = stats.binomtest(fp, outs.size).proportion_ci(1 - 2 * alpha).high
        fnr = stats.binomtest(fn, ins.size).proportion_ci(1 - 2 * alpha).high
        mu = stats.norm.ppf(1 - fpr) - stats.norm.ppf(fnr)
        if not mu >= 0:
            eps = 0.0
        else:
            def eq6(e: float, mu: float = mu) -> float:
                return (stats.norm.cdf(-e / mu + mu / 2)
                        - np.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta)
            try:
                eps = optimize.brentq(eq6, 0.0, 50.0, xtol=1e-12)
            except ValueError:
                eps = 0.0
        best = eps if best is None else max(best, eps)
    return float(best)


@pytest.mark.parametrize("shift,n,seed", [(1.0, 40, 0), (2.5, 60, 1), (0.0, 30, 2)])
def test_published_statistic_matches_the_recipe(shift: float, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ins, outs = rng.normal(shift, 1.0, n), rng.normal(0.0, 1.0, n + 7)
    got = published_gdp_epsilon(ins, outs, delta=1e-5, alpha=0.05)
    assert got.epsilon == pytest.approx(reference(ins, outs, 0.05, 1e-5), rel=1e-6, abs=1e-8)


def test_published_statistic_is_labelled_invalid() -> None:
    rng = np.random.default_rng(3)
    ins, outs = rng.normal(2.0, 1.0, 50), rng.normal(0.0, 1.0, 50)
    res = published_gdp_epsilon(ins, outs)
    assert res.kind == "invalid" and not res.statistically_valid and not res.is_bound
    n = np.unique(np.concatenate([ins, outs])).size
    assert res.notes[0] == PUBLISHED_LABEL.format(n=n)
    assert "not a valid confidence bound" in res.notes[0] and f"over {n} uncorrected" in res.notes[0]
    assert res.confidence == pytest.approx(0.9)


def test_published_statistic_is_at_least_each_per_threshold_value() -> None:
    # The maximum over thresholds with the larger per-rate significance is never below the
    # Bonferroni-corrected estimate on the same scores (same thresholds, looser bounds).
    rng = np.random.default_rng(4)
    for _ in range(5):
        ins, outs = rng.normal(1.5, 1.0, 200), rng.normal(0.0, 1.0, 200)
        pub = published_gdp_epsilon(ins, outs).epsilon
        bonf = ScoreAudit(ins, outs).gaussian_dp(delta=1e-5, threshold_strategy=Bonferroni())
        assert pub >= bonf.epsilon


def test_side_by_side_labels() -> None:
    rng = np.random.default_rng(5)
    out = statistics_side_by_side(rng.normal(2.0, 1.0, 100), rng.normal(0.0, 1.0, 100))
    assert list(out) == ["as published", "gaussian-dp bonferroni", "clopper-pearson"]
    assert [r.kind for r in out.values()] == ["invalid", "estimate", "bound"]


@pytest.mark.parametrize("kw", [{"alpha": 0.0}, {"alpha": 0.6}, {"delta": 0.0}])
def test_bad_parameters(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        published_gdp_epsilon([1.0, 2.0], [0.0, 1.0], **kw)
