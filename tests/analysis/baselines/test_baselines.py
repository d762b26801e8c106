"""Baselines (standard composition, full batch, closed-form Gaussian) and the comparison,
checked against dp_accounting's PLD computed independently in each test."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import optimize, stats

from opacus_lastiterate.analysis.baselines.composition import (
    StandardComposition,
    full_batch_epsilon,
    standard_epsilon,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
    gaussian_delta,
    gaussian_epsilon,
)
from opacus_lastiterate.analysis.comparison import compare_epsilons, compare_epsilons_for_history
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 5.0])
def test_gaussian_delta_formula(mu, eps):
    # Linear-space textbook expression with scipy's normal cdf.
    expected = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    assert gaussian_delta(mu=mu, epsilon=eps) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("mu,delta", [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-10), (8.0, 1e-5)])
def test_gaussian_epsilon_within_pld_sandwich(mu, delta):
    kw = dict(standard_deviation=1.0 / mu, value_discretization_interval=1e-3)
    upper = pld.from_gaussian_mechanism(pessimistic_estimate=True, **kw).get_epsilon_for_delta(delta)
    lower = pld.from_gaussian_mechanism(pessimistic_estimate=False, **kw).get_epsilon_for_delta(delta)
    eps = gaussian_epsilon(mu=mu, delta=delta)
    assert lower - 1e-9 <= eps <= upper + 1e-9
    assert upper - lower < 1e-2  # the sandwich is tight enough to mean something


def independent_gdp_delta(mu: float, eps: float) -> float:
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.3, 0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-6])
def test_gdp_epsilon_matches_dp_accounting_and_direct_root(mu: float, delta: float) -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    eps = gaussian_epsilon(mu=mu, delta=delta)
    # dp_accounting: a Gaussian mechanism with sensitivity 1 and noise 1/mu is mu-GDP.
    assert eps == pytest.approx(dp_accounting.get_epsilon_gaussian(1.0 / mu, delta), abs=1e-4)
    root = optimize.brentq(lambda e: independent_gdp_delta(mu, e) - delta, 0.0, 200.0, xtol=1e-13)
    assert eps == pytest.approx(root, abs=1e-8)
    assert gaussian_delta(mu=mu, epsilon=eps) == pytest.approx(delta, rel=1e-6)


@pytest.mark.parametrize(
    "mu,e5,e6",
    [
        (0.5, 1.9931, 2.2541),
        (1, 4.3772, 4.8866),
        (2, 9.9973, 10.9972),
        (4, 24.3816, 26.357),
        (8, 65.3192, 69.244),
    ],
)
def test_gdp_anchor_table(mu: float, e5: float, e6: float) -> None:
    # docs/auditing.md, "Reference values" (Gaussian DP).
    assert gaussian_epsilon(mu=mu, delta=1e-5) == pytest.approx(e5, abs=1.5e-4)
    assert gaussian_epsilon(mu=mu, delta=1e-6) == pytest.approx(e6, abs=1.5e-3)


def test_gdp_small_mu_gives_zero_and_delta_edge_cases() -> None:
    # delta(0) = 2 Phi(mu/2) - 1; if that is already <= delta, eps = 0.
    mu = 2 * stats.norm.ppf((1 + 1e-3) / 2) * 0.5
    assert gaussian_epsilon(mu=mu, delta=1e-3) == 0.0
    assert gaussian_epsilon(mu=0.0, delta=1e-5) == 0.0
    assert gaussian_delta(mu=0.0, epsilon=1.0) == 0.0


def _mp_delta(mp, eps, mu):
    """delta(eps) of mu-GDP at 50 digits, linear space (the closed form written out)."""
    eps, mu = mp.mpf(eps), mp.mpf(mu)
    return mp.ncdf(-eps / mu + mu / 2) - mp.exp(eps) * mp.ncdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.01, 0.3, 1.0, 4.0, 20.0, 50.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-8, 1e-12])
def test_gaussian_epsilon_matches_brute_force_bisection(mu: float, delta: float) -> None:
    # An independent computation: 200 bisection steps on the closed form in 50-digit arithmetic.
    mp = pytest.importorskip("mpmath")
    with mp.workdps(50):
        if _mp_delta(mp, 0, mu) <= delta:
            truth = 0.0
        else:
            lo, hi = mp.mpf(0), mp.mpf(1)
            while _mp_delta(mp, hi, mu) > delta:
                hi *= 2
            for _ in range(200):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if _mp_delta(mp, mid, mu) > delta else (lo, mid)
            truth = float(hi)
    assert gaussian_epsilon(mu=mu, delta=delta) == pytest.approx(truth, rel=1e-12, abs=1e-300)


def test_gaussian_mu_edge_values() -> None:
    assert gaussian_epsilon(mu=math.inf, delta=1e-5) == math.inf
    assert gaussian_delta(mu=math.inf, epsilon=3.0) == 1.0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: gaussian_epsilon(mu=1.0, delta=0.0), r"`delta` must be in \(0, 1\), got 0.0\."),
        (lambda: gaussian_epsilon(mu=-1.0, delta=1e-5), r"`mu` must be in \[0, inf\], got -1.0\."),
        (lambda: gaussian_delta(mu=1.0, epsilon=-1.0), r"`epsilon` must be in \[0, inf\), got -1.0\."),
    ],
)
def test_gaussian_conversion_rejects_bad_arguments(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_gaussian_conversion_takes_keywords_only() -> None:
    with pytest.raises(TypeError):
        gaussian_epsilon(1.0, 1e-5)  # type: ignore[misc]  # mu and delta are easily swapped



def test_full_batch_is_gaussian_with_mu_q_sqrt_t_over_sigma():
    eps = full_batch_epsilon(1e-5, steps=400, sample_rate=0.02, noise_multiplier=0.9)
    assert eps == gaussian_epsilon(mu=0.02 * math.sqrt(400) / 0.9, delta=1e-5)


@pytest.mark.parametrize(
    "T,q,sigma,delta",
    [(1000, 0.01, 1.0, 1e-5), (200, 0.1, 2.0, 1e-6), (3525, 256 / 60000, 1.1, 1e-5), (50, 0.5, 5.0, 1e-5)],
)
def test_standard_epsilon_is_pld_upper_bound_and_heuristic_is_below(T, q, sigma, delta):
    kw = dict(standard_deviation=sigma, sampling_prob=q, value_discretization_interval=1e-4)
    lower = pld.from_gaussian_mechanism(pessimistic_estimate=False, **kw).self_compose(T)
    upper = pld.from_gaussian_mechanism(pessimistic_estimate=True, **kw).self_compose(T)
    eps_lo, eps_hi = lower.get_epsilon_for_delta(delta), upper.get_epsilon_for_delta(delta)
    ours = standard_epsilon(delta, steps=T, sample_rate=q, noise_multiplier=sigma)
    assert eps_lo - 1e-9 <= ours <= eps_hi + 1e-9
    assert ours == pytest.approx(eps_hi, rel=1e-3)  # we report the pessimistic side
    # Heuristic <= standard, even against the optimistic (lower) estimate of the standard.
    assert privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta) <= eps_lo


def test_standard_history_composes_segments():
    h = [(1.0, 0.01, 100), (2.0, 0.05, 50)]
    a = pld.from_gaussian_mechanism(1.0, sampling_prob=0.01).self_compose(100)
    b = pld.from_gaussian_mechanism(2.0, sampling_prob=0.05).self_compose(50)
    ref = a.compose(b).get_epsilon_for_delta(1e-5)
    assert StandardComposition(h).epsilon(1e-5) == pytest.approx(ref, rel=1e-3)


def test_comparison_holds_all_four_numbers():
    c = compare_epsilons(1e-5, steps=1000, sample_rate=0.01, noise_multiplier=1.0)
    assert c.heuristic == privacy_model("heuristic", DPSGDRun.constant(steps=1000, sample_rate=0.01, noise_multiplier=1.0)).epsilon(1e-5)
    assert c.robust_heuristic >= c.heuristic
    assert c.heuristic < c.standard
    assert c.full_batch == full_batch_epsilon(1e-5, steps=1000, sample_rate=0.01, noise_multiplier=1.0)
    assert set(c.as_dict()) >= {"heuristic", "robust_heuristic", "standard", "full_batch", "delta"}
    assert compare_epsilons_for_history([], 1e-5).standard == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    "T,q,sigma,delta",
    [(1, 0.1, 1.0, 1e-6), (3, 0.1, 1.0, 1e-6), (20, 0.05, 0.8, 1e-5), (100, 0.01, 1.0, 1e-5), (50, 0.3, 2.0, 1e-8)],
)
def test_heuristic_within_dp_accounting_mixture_sandwich(T, q, sigma, delta):
    """dp_accounting's mixture-of-Gaussians PLD (the route the heuristic replaces)."""
    k = list(range(T + 1))
    w = stats.binom.pmf(k, T, q).tolist()
    kw = dict(standard_deviation=sigma * math.sqrt(T), sensitivities=k, sampling_probs=w,
              value_discretization_interval=1e-3)
    upper = pld.from_mixture_gaussian_mechanism(pessimistic_estimate=True, **kw).get_epsilon_for_delta(delta)
    lower = pld.from_mixture_gaussian_mechanism(pessimistic_estimate=False, **kw).get_epsilon_for_delta(delta)
    ours = privacy_model("heuristic", DPSGDRun.constant(steps=T, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    assert lower - 1e-7 <= ours <= upper + 1e-7
    # The pessimistic (connect-the-dots) estimate is tight; the optimistic one (privacy
    # buckets) can be loose, so closeness is asserted against the upper side only.
    assert upper - ours < 1e-2
