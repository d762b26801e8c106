"""Independent reference computations for the normalisation tests (tests only).

The package builds one-step PLDs from inverted tails, discretises them and composes them
with dp_accounting. Here one-step hockey-stick divergences are instead integrated directly,
delta(eps) = integral (p_upper - e^eps p_lower)_+, from the densities: on a dense grid for
ASGM (a sum over batch sizes of one-dimensional integrals) and by adaptive quadrature over
the projection u for the divisor leak, whose residual-norm part is integrated in closed form
for each u (p_with(u) * delta_B(eps - A(u)), delta_B from the chi-square distribution).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import integrate, special, stats


def asgm_delta_quadrature(
    n: int, q: float, sigma: float, eps: ArrayLike, *, add: bool = False, points: int = 200_001
) -> np.ndarray:
    """One step of the "batch size revealed" model, by summing over m and integrating over y
    on a uniform grid (one value per entry of ``eps``)."""
    eps = np.atleast_1d(np.asarray(eps, dtype=float))
    y = np.linspace(-14 * sigma - 1, 14 * sigma + 2, points)
    dy = y[1] - y[0]
    k = stats.binom(n, q)
    phi0 = stats.norm.pdf(y, 0.0, sigma)
    phi1 = stats.norm.pdf(y, 1.0, sigma)
    total = np.full(eps.shape, 0.0 if add else q ** (n + 1))  # m = n + 1: only with the target
    for m in range(n + 1):
        with_target = (1 - q) * k.pmf(m) * phi0 + (q * k.pmf(m - 1) * phi1 if m else 0.0)
        without = k.pmf(m) * phi0
        upper, lower = (without, with_target) if add else (with_target, without)
        for i, e in enumerate(eps):
            total[i] += float(np.sum(np.maximum(upper - math.exp(e) * lower, 0.0)) * dy)
    return total


def divisor_leak_delta_quadrature(
    c1: float, c2: float, q: float, sigma: float, d: int, eps: ArrayLike, *, add: bool = False
) -> np.ndarray:
    """One step of (sum + Z) / c in the zero-other-gradients configuration (one value per
    entry of ``eps``): adaptive quadrature over u of p_upper(u) * delta_v(eps -/+ A(u))."""
    eps = np.atleast_1d(np.asarray(eps, dtype=float))
    s1, s2 = sigma / c1, sigma / c2
    k = d - 1

    def normal_pdf(u: float, mean: float, scale: float) -> float:
        return math.exp(-0.5 * ((u - mean) / scale) ** 2) / (scale * math.sqrt(2 * math.pi))

    def p_with(u: float) -> float:
        return (1 - q) * normal_pdf(u, 0.0, s2) + q * normal_pdf(u, 1 / c2, s2)

    def p_without(u: float) -> float:
        return normal_pdf(u, 0.0, s1)

    def delta_norm(t: np.ndarray, upper_scale: float, lower_scale: float) -> np.ndarray:
        """integral (f_up(v) - e^t f_low(v))_+ dv for v = scale^2 chi2_k, vectorised in t."""
        if k == 0:
            return np.maximum(0.0, -np.expm1(t))
        # f_up / f_low = exp(a - b v): the set {ratio > e^t} is a half-line in v
        a = k * math.log(lower_scale / upper_scale)
        b = 0.5 * (1 / upper_scale**2 - 1 / lower_scale**2)
        v0 = (a - t) / b
        x_up, x_low = np.maximum(v0, 0) / upper_scale**2, np.maximum(v0, 0) / lower_scale**2
        if b > 0:  # ratio decreasing in v: the set is 0 <= v < v0
            out = special.chdtr(k, x_up) - np.exp(t) * special.chdtr(k, x_low)
        else:  # the set is v > v0
            out = special.chdtrc(k, x_up) - np.exp(t) * special.chdtrc(k, x_low)
        return np.maximum(out, 0.0)

    def integrand(u: float, e: float) -> float:
        a_loss = math.log(p_with(u) / p_without(u))
        if add:
            return float(p_without(u) * delta_norm(np.array([e + a_loss]), s1, s2)[0])
        return float(p_with(u) * delta_norm(np.array([e - a_loss]), s2, s1)[0])

    width = 12 * max(s1, s2)
    centre = 0.5 / c2
    grid = np.linspace(centre - width, centre + width, 33)  # split the range for accuracy
    out = np.zeros(eps.shape)
    for i, e in enumerate(eps):
        for a, b in itertools.pairwise(grid):
            out[i] += integrate.quad(
                integrand, a, b, args=(e,), epsabs=0.0, epsrel=1e-11, limit=200
            )[0]
    return out
