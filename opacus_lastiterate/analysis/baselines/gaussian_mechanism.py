"""The Gaussian mechanism in closed form (mu-GDP), the one conversion of the package.

For N(0, 1) against N(mu, 1) (Balle & Wang 2018, Theorem 8; Dong, Roth & Su 2019, Cor. 2.13):

    delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)

Both directions coincide. Evaluated in log space with ``log_ndtr``; eps(delta) is a
bracketed root find on this decreasing function (about 1e-14 relative). dp_accounting's
``get_epsilon_gaussian(1 / mu, delta)`` solves the same equation (agreeing to about 1e-12
relative) but takes about 70 times as long per call (it evaluates through
``scipy.stats.norm``), and it has no delta(eps).
"""

from __future__ import annotations

import math

from scipy import optimize, special

from opacus_lastiterate.analysis._validation import check_delta, check_epsilon, check_in_interval

__all__ = ["gaussian_delta", "gaussian_epsilon"]


def _log_delta(eps: float, mu: float) -> float:
    a = float(special.log_ndtr(-eps / mu + mu / 2.0))
    b = eps + float(special.log_ndtr(-eps / mu - mu / 2.0))
    if not b < a:
        return -math.inf
    return a + math.log(-math.expm1(b - a))


def _check_mu(mu: object) -> float:
    return check_in_interval("mu", mu, 0.0, math.inf, low_open=False, high_open=False)


def gaussian_delta(*, mu: float, epsilon: float) -> float:
    """delta(eps) of the mu-GDP Gaussian mechanism (sensitivity / noise std = mu, in
    [0, inf]; 0 for mu = 0, 1 for mu = inf)."""
    m = _check_mu(mu)
    eps = check_epsilon(epsilon)
    if m == 0.0:
        return 0.0
    if math.isinf(m):
        return 1.0
    return math.exp(_log_delta(eps, m))


def gaussian_epsilon(*, mu: float, delta: float) -> float:
    """eps(delta) of the mu-GDP Gaussian mechanism (mu in [0, inf]): the root of
    delta(eps) = ``delta`` to about 1e-14 relative; 0 when delta >= delta(0) (and for
    mu = 0), inf for mu = inf."""
    m = _check_mu(mu)
    d = check_delta(delta)
    if m == 0.0:
        return 0.0
    if math.isinf(m):
        return math.inf
    log_target = math.log(d)
    f = lambda e: max(_log_delta(e, m), -2000.0) - log_target  # noqa: E731
    if f(0.0) <= 0:
        return 0.0
    hi = m * m / 2.0 + m * (2.0 + math.sqrt(2.0 * -log_target))
    while f(hi) > 0:
        hi *= 2.0
    return float(optimize.brentq(f, 0.0, hi, xtol=1e-14 * (1.0 + hi), rtol=1e-15))
