"""Coverage: the default strategy's bound exceeds the truth at most at its nominal rate,
the naive maximum over thresholds more often.

Mechanism: out-scores ~ N(0, 1), in-scores ~ N(mu, 1). Its trade-off curve is exactly
Gaussian, so it is mu-GDP and no better, and its (eps, delta) curve is (Dong, Roth, Su 2019,
Cor. 2.13)

    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2),

solved for eps below independently of the package. Because every threshold of this pair is
tight for the GDP mu bound, it is the setting where threshold overfitting shows most
(``docs/auditing.md``, "Threshold selection": naive about 8% at n = 1000 per side).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from opacus_lastiterate.analysis.audit import NaiveMax, audit_clopper_pearson, audit_gaussian_dp

NOMINAL = 0.05


def true_epsilon(mu: float, delta: float) -> float:
    def log_delta(eps: float) -> float:
        a = stats.norm.logcdf(-eps / mu + mu / 2)
        b = stats.norm.logcdf(-eps / mu - mu / 2)
        return a + math.log1p(-math.exp(eps + b - a))

    return optimize.brentq(lambda e: log_delta(e) - math.log(delta), 0.0, 100.0, xtol=1e-12)


def slack_count(reps: int, rate: float, tail: float = 1e-3) -> int:
    """Largest count a procedure failing at exactly ``rate`` exceeds with probability < ``tail``."""
    return int(stats.binom.ppf(1 - tail, reps, rate))


def test_default_strategy_covers_and_naive_max_does_not() -> None:
    mu, delta, n, reps = 2.0, 1e-5, 1000, 300
    eps_true = true_epsilon(mu, delta)
    rng = np.random.default_rng(20240601)
    default_exceed = naive_exceed = 0
    for _ in range(reps):
        outs = rng.normal(0.0, 1.0, n)
        ins = rng.normal(mu, 1.0, n)
        default = audit_gaussian_dp(ins, outs, delta=delta, confidence=1 - NOMINAL)
        naive = audit_gaussian_dp(
            ins, outs, delta=delta, confidence=1 - NOMINAL, threshold_strategy=NaiveMax()
        )
        default_exceed += default.epsilon > eps_true
        naive_exceed += naive.epsilon > eps_true
        # The mu bound and the epsilon must agree on exceedance (eps is increasing in mu).
        assert (default.epsilon > eps_true) == (default.mu > mu)
    # Valid: at most the nominal rate, up to binomial slack (a 5%-failing procedure exceeds
    # this count with probability < 0.1%).
    assert default_exceed <= slack_count(reps, NOMINAL)
    # Naive: more failures than the default, and above the nominal rate (its true failure rate
    # here is about 8.5%; a procedure failing at 8.5% stays <= 15/300 with probability ~1.5%).
    assert naive_exceed > default_exceed
    assert naive_exceed / reps > NOMINAL


def test_default_clopper_pearson_bound_covers() -> None:
    # Pure CP bound against the true epsilon of the same pair at a delta where the optimal
    # test is inside the data range (so the bound is not trivially far below the truth).
    mu, delta, n, reps = 2.0, 0.05, 500, 200
    eps_true = true_epsilon(mu, delta)
    rng = np.random.default_rng(7)
    exceed = 0
    values = []
    for _ in range(reps):
        res = audit_clopper_pearson(rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n), delta=delta)
        exceed += res.epsilon > eps_true
        values.append(res.epsilon)
    assert exceed <= slack_count(reps, NOMINAL)
    assert np.median(values) > 0.4 * eps_true  # and it is informative (about 0.5 here)


@pytest.mark.slow
def test_every_valid_strategy_covers() -> None:
    """Longer run (about 15 s): every valid strategy stays within its nominal rate on the GDP
    mu bound, the setting where every threshold is tight; the naive maximum does not."""
    from opacus_lastiterate.analysis.audit import (
        Bonferroni,
        HeldOutSplit,
        MultiSplit,
        RankGridBonferroni,
    )

    mu, delta, n, reps = 1.0, 1e-5, 1000, 500
    eps_true = true_epsilon(mu, delta)
    rng = np.random.default_rng(31337)
    strategies = {
        "rank-grid": lambda: RankGridBonferroni(),
        "bonferroni": lambda: Bonferroni(),
        "split": lambda: HeldOutSplit(seed=int(rng.integers(2**31))),
        "multi-split": lambda: MultiSplit(num_splits=11, seed=int(rng.integers(2**31))),
        "naive": lambda: NaiveMax(),
    }
    exceed = dict.fromkeys(strategies, 0)
    for _ in range(reps):
        outs = rng.normal(0.0, 1.0, n)
        ins = rng.normal(mu, 1.0, n)
        for name, make in strategies.items():
            res = audit_gaussian_dp(ins, outs, delta=delta, threshold_strategy=make())
            exceed[name] += res.epsilon > eps_true
    limit = slack_count(reps, NOMINAL)
    for name in ("rank-grid", "bonferroni", "split", "multi-split"):
        assert exceed[name] <= limit, exceed
    assert exceed["naive"] > max(exceed[k] for k in exceed if k != "naive")
    assert exceed["naive"] / reps > NOMINAL, exceed
