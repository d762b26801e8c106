"""Soundness on the exact last-iterate mechanism (``docs/last_iterate.md``,
"Statement and threat model").

For a linear loss the final model of T DP-SGD steps reduces to one coordinate distributed as

    P = Binomial(T, q) + N(0, sigma^2 T)   (canary in),   Q = N(0, sigma^2 T)   (canary out),

and the heuristic epsilon is *exactly* its privacy. Scores drawn from P and Q with numpy are
therefore an audit whose true epsilon we know: every valid lower bound must stay below it
(at the nominal confidence), and grow towards it as trials grow.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    OneRunDeltaWarning,
    audit_clopper_pearson,
    audit_gaussian_dp,
    audit_one_run,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

NOMINAL = 0.05
CONFIGS = [(1000, 0.01, 1.0), (10, 0.1, 0.5), (1, 0.5, 0.5)]


def sample(
    rng: np.random.Generator, n: int, steps: int, q: float, sigma: float, canary_in: bool
) -> np.ndarray:
    x = rng.normal(0.0, sigma * np.sqrt(steps), n)
    if canary_in:
        x = x + rng.binomial(steps, q, n)
    return x


def test_heuristic_matches_anchor_value() -> None:
    # docs/last_iterate.md, "Baselines" (also dp_accounting's mixture PLD): T=1000, q=0.01, sigma=1.
    assert privacy_model("heuristic", DPSGDRun.constant(steps=1000, sample_rate=0.01, noise_multiplier=1.0)).epsilon(1e-5) == pytest.approx(1.2778, abs=2e-4)


@pytest.mark.parametrize("steps,q,sigma", CONFIGS)
def test_bounds_stay_below_heuristic(steps: int, q: float, sigma: float) -> None:
    delta, n, reps = 1e-5, 2000, 20
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    rng = np.random.default_rng(steps * 1000 + int(q * 100))
    exceed = {"cp": 0, "one-run": 0}
    for _ in range(reps):
        ins = sample(rng, n, steps, q, sigma, True)
        outs = sample(rng, n, steps, q, sigma, False)
        exceed["cp"] += audit_clopper_pearson(ins, outs, delta=delta).epsilon > eps_h
        # One run: each of m = 1000 canaries is in by a fair coin; scores independent draws
        # from P or Q (a parallel composition, so still exactly eps_h-DP per canary).
        coins = rng.random(1000) < 0.5
        scores = np.where(
            coins,
            sample(rng, 1000, steps, q, sigma, True),
            sample(rng, 1000, steps, q, sigma, False),
        )
        exceed["one-run"] += (
            audit_one_run(scores[coins], scores[~coins], delta=delta).epsilon > eps_h
        )
    # A procedure failing at exactly 5% exceeds this count with probability < 0.1%.
    limit = int(stats.binom.ppf(1 - 1e-3, reps, NOMINAL))
    assert exceed["cp"] <= limit and exceed["one-run"] <= limit, (exceed, eps_h)


@pytest.mark.parametrize("steps,q,sigma", CONFIGS)
def test_bounds_grow_towards_heuristic(steps: int, q: float, sigma: float) -> None:
    """Same pair, 2,000 / 20,000 / 200,000 trials per side: the Clopper-Pearson bound grows
    and stays below; the GDP estimate (not a bound) is reported, not asserted."""
    delta = 1e-5
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    rng = np.random.default_rng(12345)
    bounds = []
    for n in (2_000, 20_000, 200_000):
        ins = sample(rng, n, steps, q, sigma, True)
        outs = sample(rng, n, steps, q, sigma, False)
        res = audit_clopper_pearson(ins, outs, delta=delta)
        gdp = audit_gaussian_dp(ins, outs, delta=delta)
        assert gdp.kind == "estimate"
        bounds.append(res.epsilon)
        assert res.epsilon < eps_h, (n, res.epsilon, eps_h)
    assert bounds[0] < bounds[1] < bounds[2]
    assert bounds[2] > 0.35 * eps_h  # informative: 0.4-0.6 of the heuristic at 200k per side


def test_one_run_with_many_canaries_stays_below() -> None:
    steps, q, sigma, delta = 10, 0.1, 0.5, 1e-6
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    rng = np.random.default_rng(99)
    m = 20_000
    coins = rng.random(m) < 0.5
    scores = np.where(
        coins, sample(rng, m, steps, q, sigma, True), sample(rng, m, steps, q, sigma, False)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", OneRunDeltaWarning)  # 2 m delta = 0.04: must not warn
        res = audit_one_run(scores[coins], scores[~coins], delta=delta)
    assert 0.0 < res.epsilon < eps_h
