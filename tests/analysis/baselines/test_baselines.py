"""Baselines (standard composition, full batch, closed-form Gaussian) and the comparison,
checked against dp_accounting's PLD computed independently in each test."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import stats

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
from opacus_lastiterate.analysis.last_iterate.heuristic import heuristic_epsilon


@pytest.mark.parametrize("mu", [0.05, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 5.0])
def test_gaussian_delta_formula(mu, eps):
    # Linear-space textbook expression with scipy's normal cdf.
    expected = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    assert gaussian_delta(eps, mu=mu) == pytest.approx(expected, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("mu,delta", [(0.5, 1e-5), (1.0, 1e-6), (4.0, 1e-10), (8.0, 1e-5)])
def test_gaussian_epsilon_within_pld_sandwich(mu, delta):
    kw = dict(standard_deviation=1.0 / mu, value_discretization_interval=1e-3)
    upper = pld.from_gaussian_mechanism(pessimistic_estimate=True, **kw).get_epsilon_for_delta(delta)
    lower = pld.from_gaussian_mechanism(pessimistic_estimate=False, **kw).get_epsilon_for_delta(delta)
    eps = gaussian_epsilon(delta, mu=mu)
    assert lower - 1e-9 <= eps <= upper + 1e-9
    assert upper - lower < 1e-2  # the sandwich is tight enough to mean something


def test_full_batch_is_gaussian_with_mu_q_sqrt_t_over_sigma():
    eps = full_batch_epsilon(1e-5, steps=400, sample_rate=0.02, noise_multiplier=0.9)
    assert eps == gaussian_epsilon(1e-5, mu=0.02 * math.sqrt(400) / 0.9)


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
    assert heuristic_epsilon(delta, steps=T, sample_rate=q, noise_multiplier=sigma) <= eps_lo


def test_standard_history_composes_segments():
    h = [(1.0, 0.01, 100), (2.0, 0.05, 50)]
    a = pld.from_gaussian_mechanism(1.0, sampling_prob=0.01).self_compose(100)
    b = pld.from_gaussian_mechanism(2.0, sampling_prob=0.05).self_compose(50)
    ref = a.compose(b).get_epsilon_for_delta(1e-5)
    assert StandardComposition(h).epsilon(1e-5) == pytest.approx(ref, rel=1e-3)


def test_comparison_holds_all_four_numbers():
    c = compare_epsilons(1e-5, steps=1000, sample_rate=0.01, noise_multiplier=1.0)
    assert c.heuristic == heuristic_epsilon(1e-5, steps=1000, sample_rate=0.01, noise_multiplier=1.0)
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
    ours = heuristic_epsilon(delta, steps=T, sample_rate=q, noise_multiplier=sigma)
    assert lower - 1e-7 <= ours <= upper + 1e-7
    # The pessimistic (connect-the-dots) estimate is tight; the optimistic one (privacy
    # buckets) can be loose, so closeness is asserted against the upper side only.
    assert upper - ours < 1e-2
