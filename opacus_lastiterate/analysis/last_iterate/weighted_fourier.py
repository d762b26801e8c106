"""The characteristic-function inversion of the weighted heuristic: its error terms, the
Chernoff bound that places its interval, and the inverted distribution it hands to the roots.

The weighted pair (:mod:`.weighted_heuristic`) is P = law of X = K + Z and Q = N(0, s^2), with
K = sum_t w_t Bernoulli(q_t) and Z ~ N(0, s^2), s^2 = sum_t sigma_t^2 w_t^2. The weight grid
rounds every w_t to a lattice, so its cost grows with T x accuracy^-1. Here the weights enter
exactly, through the characteristic function

    phi(theta) = E exp(i theta X) = exp(-s^2 theta^2 / 2) prod_t (1 - q_t + q_t e^{i w_t theta}),

and the distribution function of X is recovered by the Gil-Pelaez formula with the midpoint
rule (Davies, "Numerical inversion of a characteristic function", Biometrika 60 (1973)):

    F~(x) = 1/2 - (1/pi) sum_{k=0}^{M-1} Im[phi(theta_k) e^{-i theta_k x}] / (k + 1/2),
    theta_k = (k + 1/2) Delta,  p~(x) = dF~/dx = (Delta/pi) sum_k Re[phi(theta_k) e^{-i theta_k x}].

Error of F~ (``docs/last_iterate.md``, "Weighted heuristic without a grid"), as charged by
:mod:`.incremental_fourier`, which keeps phi up to date step by step:

* *Aliasing.* The infinite midpoint sum equals E[h(X - x)] with h the indicator of
  (-D, 0) + 2D Z, D = 2 pi / Delta (a square-wave Fourier series), so it differs from F(x) by
  at most P(X <= x - D) or P(X >= x + D). For x in R = [a, b] with Pr[Z <= a] <= eta delta and
  a Chernoff bound Pr[X >= b] <= eta delta (:func:`chernoff_upper`), D = b - a makes both
  tails <= eta delta (K >= 0, so Pr[X <= y] <= Pr[Z <= y]).
* *Truncation.* abs(phi(theta)) <= exp(-s^2 theta^2 / 2): the terms k >= M sum to less than a
  geometric series that M is chosen to make <= eta delta.
* *Rounding.* log phi(theta) is a pairwise sum of T terms, each computed from the sine and
  cosine of its half angle (:func:`.step_factors.log_factors`: accurate relative to its size,
  also where it is tiny): a relative error of ``FP_CHARGE`` times a few operations on the sum
  of their magnitudes is charged, plus the angles, and on every term of the inversion sums.
  Runs with a sample rate within ``Q_NEAR_HALF`` of 1/2 are declined (near there a factor's
  rounding can exceed its charge).

With e the sum of these, for every x in R, abs(F(x) - F~(x)) <= e. The hockey-stick divergences
are suprema over half-lines: H(P, Q) = sup_x [1 - F(x) - e^eps Q(X > x)] and H(Q, P) = sup_x
[Q(X <= x) - e^eps F(x)], so H(P, Q) is within e and H(Q, P) within e^eps e of the same suprema
with F~. Each supremum is attained where p~ = e^{+-eps} q, a root in x
(:func:`.fourier_roots.solve_epsilons`). The upper epsilon solves the approximate suprema
against delta minus their error, the lower one against delta plus it, so [lower, upper]
brackets the exact weighted heuristic.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = []

ETA = 1e-9
"""Each neglected tail (aliasing, truncation) is at most ETA x delta."""
FP_CHARGE = 8.0 * np.finfo(float).eps
"""Rounding charge per operation, relative (module docstring)."""
MAX_TERMS = 20_000
"""At most this many frequencies (a noise scale too small for the interval: declined)."""
_CHERNOFF_ROUNDS = 40  # Newton steps at most (about 5 from the Gaussian start)
_BLOCK = 1 << 16  # steps per block of the sums over the steps (temporaries of 0.5 MB each)


def chernoff_upper(w: np.ndarray, q: np.ndarray, s: float, target: float) -> tuple[float, float]:
    """(b, lambda): a point b with Pr[X >= b] <= target, from the Chernoff bound at the
    returned lambda (any lambda > 0 gives a valid b; this one is about the best).

    b(lambda) = (lambda^2 s^2 / 2 + S(lambda) - log target) / lambda, S = sum q (e^{lambda w}
    - 1), is least where G = lambda^2 s^2 / 2 + lambda S' - S + log target = 0; G increases
    and is convex in lambda > 0, so Newton's method from the Gaussian approximation
    sqrt(-2 log target / (s^2 + sum q w^2)) converges (monotonically after its first step):
    a few passes over the steps, instead of the twenty of a bounded scalar search."""
    log_t = math.log(target)
    w_max = float(w.max())
    lo, hi = 1e-6 / s, min(700.0 / w_max, 1e6 / s)
    blocks = [slice(i, i + _BLOCK) for i in range(0, w.size, _BLOCK)]  # O(block) temporaries

    def b(lam: float) -> float:
        if lam * w_max > 700.0:
            return math.inf
        total = sum(float(np.dot(q[k], np.expm1(lam * w[k]))) for k in blocks)
        return (0.5 * lam * lam * s * s + total - log_t) / lam

    def sums(lam: float) -> tuple[float, float, float]:
        """sum q (e^{lam w} - 1), sum q w e^{lam w}, sum q w^2 e^{lam w}."""
        s0 = s1 = s2 = 0.0
        for k in blocks:
            qk, wk = q[k], w[k]
            grow = np.exp(lam * wk)
            qw = qk * wk
            s0 += float(np.dot(qk, grow - 1.0))
            s1 += float(np.dot(qw, grow))
            s2 += float(np.dot(qw * wk, grow))
        return s0, s1, s2

    qww = sum(float((q[k] * w[k] * w[k]).sum()) for k in blocks)  # one block: as unblocked
    lam = min(max(math.sqrt(-2.0 * log_t / (s * s + qww)), lo), hi)
    for _ in range(_CHERNOFF_ROUNDS):
        s0, s1, s2 = sums(lam)
        g = 0.5 * lam * lam * s * s + lam * s1 - s0 + log_t
        slope = lam * (s * s + s2)
        nxt = min(max(lam - g / slope, lo), hi)
        done = abs(nxt - lam) <= 1e-6 * lam
        lam = nxt
        if done:
            break
    best = min((b(lam), lam), (b(lo), lo), (b(hi), hi))
    return best[0], best[1]


class Inversion:
    """F~ and p~ of X - mu (centred: smaller phases) on the interval R = [a, b], from the
    characteristic function ``phi`` of X - mu at the frequencies ``(k + 1/2) step``, k < M,
    with ``error`` the certified bound on abs(F - F~) on R (module docstring), as
    :mod:`.incremental_fourier` sets it for :func:`.fourier_roots.solve_epsilons`."""

    s: float
    mu: float
    a: float
    b: float
    step: float
    k: np.ndarray
    phi: np.ndarray
    error: float
    terms: int
    pdf_floor: float

    def set_parts(
        self, phi: np.ndarray, step: float, s: float, mu: float, a: float, b: float,
        error: float,
    ) -> None:
        """Set the inversion from its parts (the frequencies are (k + 1/2) ``step``)."""
        self.phi, self.step, self.s, self.mu, self.a, self.b = phi, step, s, mu, a, b
        self.k = np.arange(phi.size) + 0.5
        self.error = error
        self.terms = int(phi.size)
        # densities below this are treated as noise (no likelihood ratio is read there)
        self.pdf_floor = 1e3 * self.error / s
