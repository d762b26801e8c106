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
