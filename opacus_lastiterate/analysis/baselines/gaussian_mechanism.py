"""The Gaussian mechanism in closed form (mu-GDP).

For N(0, 1) against N(mu, 1) (Balle & Wang 2018, Theorem 8; Dong, Roth & Su 2019):

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)

Both directions coincide. Evaluated in log space with ``log_ndtr``; eps(delta) is a
bracketed root find on this decreasing function.
"""

from __future__ import annotations

import math

from scipy import optimize, special

from opacus_lastiterate.analysis._validation import check_delta, check_epsilon, check_positive

__all__ = ["gaussian_delta", "gaussian_epsilon"]


def _log_delta(eps: float, mu: float) -> float:
    a = float(special.log_ndtr(-eps / mu + mu / 2.0))
    b = eps + float(special.log_ndtr(-eps / mu - mu / 2.0))
    if not b < a:
        return -math.inf
    return a + math.log(-math.expm1(b - a))


def gaussian_delta(epsilon: float, *, mu: float) -> float:
    """delta(eps) of the mu-GDP Gaussian mechanism (sensitivity / noise std = mu)."""
    eps = check_epsilon(epsilon)
    mu = check_positive("mu", mu, allow_inf=False)
    return math.exp(_log_delta(eps, mu))


def gaussian_epsilon(delta: float, *, mu: float) -> float:
    """eps(delta) of the mu-GDP Gaussian mechanism; 0 when delta >= delta(0)."""
    d = check_delta(delta)
    mu = check_positive("mu", mu)
    log_target = math.log(d)
    f = lambda e: max(_log_delta(e, mu), -2000.0) - log_target  # noqa: E731
    if f(0.0) <= 0:
        return 0.0
    hi = mu * mu / 2.0 + mu * (2.0 + math.sqrt(2.0 * -log_target))
    while f(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-14 * (1.0 + hi), rtol=1e-15))
