"""The characteristic-function route of the weighted heuristic against independent answers:
enumeration of every inclusion pattern (exact), the exact constant-rate heuristic, and the
certified brackets of the grid engine."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic import heuristic_epsilon
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    cosine_schedule,
    sgd_weights,
)
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import fourier_solve
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_epsilon_result,
)


def _enumerated(w, q, sigma, delta):
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    s = math.sqrt(float(np.sum((w * sigma) ** 2)))
    with np.errstate(divide="ignore"):  # q = 1: patterns of probability 0
        log_p = np.log(probs)
    return ShiftedGaussianMixture(bits @ w, log_p, s).epsilon(delta)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("delta", [1e-3, 1e-6])
def test_brackets_the_enumerated_value(seed, delta):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 13))
    w = rng.uniform(0.05, 1.0, n)
    q = rng.choice([0.01, 0.1, 0.4, 0.9, 1.0], n)
    sigma = rng.uniform(0.6, 3.0, n)
    r = fourier_solve(delta, w, q, sigma, 1e-3)
    assert r is not None
    exact = _enumerated(w, q, sigma, delta)
    assert r.lower_bound * (1 - 1e-9) - 1e-12 <= exact <= r.value * (1 + 1e-9) + 1e-12
    assert r.relative_accuracy <= 1e-3


@pytest.mark.parametrize(("steps", "q", "sigma"), [(50, 0.02, 1.0), (400, 0.005, 0.8)])
def test_constant_weights_bracket_the_constant_rate_heuristic(steps, q, sigma):
    exact = heuristic_epsilon(1e-5, steps=steps, sample_rate=q, noise_multiplier=sigma)
    r = fourier_solve(1e-5, np.full(steps, 0.3), np.full(steps, q), np.full(steps, sigma), 1e-3)
    assert r is not None
    assert r.lower_bound * (1 - 1e-9) <= exact <= r.value * (1 + 1e-9)
    assert r.relative_accuracy < 1e-6  # far tighter than the grid's brackets


@pytest.mark.parametrize(("steps", "q", "momentum"), [(300, 0.03, 0.9), (600, 0.01, 0.0)])
def test_within_the_grid_brackets_on_a_cosine_schedule(steps, q, momentum):
    lrs = cosine_schedule(0.1, steps)
    w = sgd_weights(lrs, momentum=momentum)
    qq, ss = np.full(steps, q), np.full(steps, 1.0)
    r = fourier_solve(1e-5, w, qq, ss, 1e-3)
    grid = weighted_heuristic_epsilon_result(
        1e-5, weights=w, sample_rates=qq, noise_multipliers=ss, accuracy=1e-4
    )
    assert r is not None
    assert grid.lower_bound * (1 - 1e-12) <= r.lower_bound <= r.value
    assert r.value <= grid.value * (1 + 1e-12)


def test_declines_what_it_cannot_certify():
    # epsilon about 22 at T = 10^4: the reverse direction would need F to 1e-15 of e^-22
    lrs = cosine_schedule(0.5, 10_000)
    w = sgd_weights(lrs, momentum=0.9)
    assert fourier_solve(1e-5, w, np.full(w.size, 0.045), np.ones(w.size), 1e-3) is None
    # a delta below what double precision resolves
    assert fourier_solve(1e-300, np.ones(3), np.full(3, 0.5), np.ones(3), 1e-3) is None


def test_chernoff_upper_is_the_least_bound_over_lambda() -> None:
    """Newton's stationary point of b(lambda) against a brute-force scan of lambda (each
    b(lambda) is a valid Chernoff bound, so the least is the one wanted), and the bound held
    against Monte Carlo: Pr[X >= b] <= target for X = sum Bernoulli(q) w + N(0, s^2)."""
    from opacus_lastiterate.analysis.last_iterate.weighted_fourier import chernoff_upper

    rng = np.random.default_rng(5)
    for t, sigma, target in ((5, 1.0, 1e-3), (100, 0.5, 1e-9), (1500, 2.0, 1e-14), (20, 0.3, 0.05)):
        w = rng.uniform(0.01, 5.0, t)
        q = rng.uniform(0.01, 0.5, t)
        s = sigma * math.sqrt(float(np.sum(w * w)))
        b, lam = chernoff_upper(w, q, s, target)

        def bound(x: float) -> float:
            return (0.5 * x * x * s * s + float(np.dot(q, np.expm1(x * w))) - math.log(target)) / x

        assert b == bound(lam)  # the bound at the lambda returned
        grid = np.exp(np.linspace(math.log(1e-6 / s), math.log(min(700 / w.max(), 1e6 / s)), 20001))
        brute = min(bound(x) for x in grid)
        assert b <= brute * (1 + 1e-9) and b >= brute * (1 - 1e-3)
        if target >= 1e-3:  # Monte Carlo: the tail beyond b is at most target (3 sigma slack)
            n = 200_000
            x = (rng.random((n, t)) < q) @ w + rng.normal(0.0, s, n)
            p = float(np.mean(x >= b))
            assert p <= target + 3 * math.sqrt(target / n)
