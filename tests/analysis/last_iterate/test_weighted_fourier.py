"""The Chernoff bound that places the interval of the characteristic-function inversion
(``weighted_fourier.chernoff_upper``) against a brute-force scan and Monte Carlo."""

from __future__ import annotations

import math

import numpy as np

from opacus_lastiterate.analysis.last_iterate.weighted_fourier import chernoff_upper


def test_chernoff_upper_is_the_least_bound_over_lambda() -> None:
    """Newton's stationary point of b(lambda) against a brute-force scan of lambda (each
    b(lambda) is a valid Chernoff bound, so the least is the one wanted), and the bound held
    against Monte Carlo: Pr[X >= b] <= target for X = sum Bernoulli(q) w + N(0, s^2)."""
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
