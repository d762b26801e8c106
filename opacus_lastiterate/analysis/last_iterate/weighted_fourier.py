"""The weighted heuristic by inversion of the characteristic function (no weight grid).

The weighted pair (:mod:`.weighted_heuristic`) is P = law of X = K + Z and Q = N(0, s^2), with
K = sum_t w_t Bernoulli(q_t) and Z ~ N(0, s^2), s^2 = sum_t sigma_t^2 w_t^2. The grid engines
round every w_t to a lattice, so their cost grows with T x accuracy^-1. Here the weights enter
exactly, through the characteristic function

    phi(theta) = E exp(i theta X) = exp(-s^2 theta^2 / 2) prod_t (1 - q_t + q_t e^{i w_t theta}),

and the distribution function of X is recovered by the Gil-Pelaez formula with the midpoint
rule (Davies, "Numerical inversion of a characteristic function", Biometrika 60 (1973)):

    F~(x) = 1/2 - (1/pi) sum_{k=0}^{M-1} Im[phi(theta_k) e^{-i theta_k x}] / (k + 1/2),
    theta_k = (k + 1/2) Delta,  p~(x) = dF~/dx = (Delta/pi) sum_k Re[phi(theta_k) e^{-i theta_k x}].

Error of F~ (``docs/last_iterate.md``, "Weighted heuristic without a grid"):

* *Aliasing.* The infinite midpoint sum equals E[h(X - x)] with h the indicator of
  (-D, 0) + 2D Z, D = 2 pi / Delta (a square-wave Fourier series), so it differs from F(x) by
  at most P(X <= x - D) or P(X >= x + D). For x in R = [a, b] with Pr[Z <= a] <= eta delta and
  a Chernoff bound Pr[X >= b] <= eta delta (log E e^{lambda K} <= sum_t q_t (e^{lambda w_t} - 1)),
  D = b - a makes both tails <= eta delta (K >= 0, so Pr[X <= y] <= Pr[Z <= y]).
* *Truncation.* abs(phi(theta)) <= exp(-s^2 theta^2 / 2): the terms k >= M sum to less than a
  geometric series that M is chosen to make <= eta delta.
* *Rounding.* log phi(theta) is a pairwise sum of T terms, each computed from the sine and
  cosine of its half angle (:func:`.step_factors.log_factors`: accurate relative to its size,
  also where it is tiny): a relative error of 8 machine epsilons times
  (4 + ``PHASOR_CHARGE`` + log2 T + theta max w) on the sum of their magnitudes is charged,
  plus theta sum_t g(q_t) w_t times 8 (4 + ``PHASOR_CHARGE``) epsilons for the angles (g(q) =
  q / abs(1 - 2 q)), and 8 epsilons times (4 + log2 M + theta abs(x)) on every term of the
  inversion sums. Runs with a sample rate within ``Q_NEAR_HALF`` of 1/2 are declined (near
  there a factor's rounding can exceed its charge).

With e the sum of these, for every x in R, abs(F(x) - F~(x)) <= e. The hockey-stick divergences are
suprema over half-lines: H(P, Q) = sup_x [1 - F(x) - e^eps Q(X > x)] and H(Q, P) = sup_x
[Q(X <= x) - e^eps F(x)], so H(P, Q) is within e and H(Q, P) within e^eps e of the same
suprema with F~ (the points outside R contribute at most eta delta, resp. e^eps eta delta).
Each supremum is attained where p~ = e^{+-eps} q, a one-dimensional root in x. The upper
epsilon solves the approximate suprema against delta minus their error, the lower one against
delta plus it, so [lower, upper] brackets the exact weighted heuristic up to the root finder's
tolerance. :func:`fourier_solve` returns ``None`` when it cannot certify the requested
accuracy (a tiny delta, a noise scale too small for the grid of x, a non-monotone likelihood
ratio in the noise floor); the grid engines answer then.

Cost: O(T M) for phi (M about 100-300 frequencies), then O(M) per point of x.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, special

from opacus_lastiterate.analysis.last_iterate.step_factors import (
    PHASOR_CHARGE,
    Q_NEAR_HALF,
    g_q,
    log_factors,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import WeightedHeuristicResult

__all__ = ["ETA", "FP_CHARGE", "MAX_TERMS", "Inversion", "chernoff_upper", "fourier_solve"]

ETA = 1e-9
"""Each neglected tail (aliasing, truncation) is at most ETA x delta."""
FP_CHARGE = 8.0 * np.finfo(float).eps
"""Rounding charge per operation, relative (module docstring)."""
MAX_TERMS = 20_000
"""At most this many frequencies (a noise scale too small for the interval: declined)."""
_FP = FP_CHARGE
_MAX_TERMS = MAX_TERMS
_SCAN = 192  # points of x scanned for the root brackets
_XTOL = 1e-13  # root tolerance in x, relative to s
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)

_Values = tuple[np.ndarray, np.ndarray]  # (F~(x), p~(x)) at points x


_CHERNOFF_ROUNDS = 40  # Newton steps at most (about 5 from the Gaussian start)


def _chernoff_upper(w: np.ndarray, q: np.ndarray, s: float, target: float) -> float:
    """A point b with Pr[X >= b] <= target: min over lambda of
    (lambda^2 s^2 / 2 + sum_t q_t expm1(lambda w_t) - log target) / lambda (any lambda is valid)."""
    return chernoff_upper(w, q, s, target)[0]


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

    def b(lam: float) -> float:
        if lam * w_max > 700.0:
            return math.inf
        return (0.5 * lam * lam * s * s + float(np.dot(q, np.expm1(lam * w))) - log_t) / lam

    qw = q * w
    qww = qw * w
    lam = min(max(math.sqrt(-2.0 * log_t / (s * s + float(qww.sum()))), lo), hi)
    for _ in range(_CHERNOFF_ROUNDS):
        grow = np.exp(lam * w)
        s0 = float(np.dot(q, grow - 1.0))
        g = 0.5 * lam * lam * s * s + lam * float(np.dot(qw, grow)) - s0 + log_t
        slope = lam * (s * s + float(np.dot(qww, grow)))
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
    with ``error`` the certified bound on abs(F - F~) on R (module docstring). Built from
    scratch by :class:`_Inversion`; incrementally by :mod:`.incremental_fourier`."""

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

    def evaluate_slope(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(F~(x), p~(x), dp~/dx(x)) at centred points x."""
        theta = self.k * self.step
        e = self.phi * np.exp(-1j * np.multiply.outer(x, theta))
        cdf = 0.5 - (e.imag / self.k).sum(axis=-1) / math.pi
        pdf = self.step / math.pi * e.real.sum(axis=-1)
        slope = self.step / math.pi * (e.imag * theta).sum(axis=-1)
        return cdf, pdf, slope

    def evaluate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(F~(x), p~(x)) at centred points x."""
        e = self.phi * np.exp(-1j * np.multiply.outer(x, self.k * self.step))
        cdf = 0.5 - (e.imag / self.k).sum(axis=-1) / math.pi
        pdf = self.step / math.pi * e.real.sum(axis=-1)
        return cdf, pdf

    def log_q(self, x: np.ndarray) -> np.ndarray:
        """log of the density of Q at centred x."""
        z = (x + self.mu) / self.s
        return -0.5 * z * z - math.log(self.s) - _LOG_SQRT_2PI

    # The gaps of both directions at points x, against target - sign * e (sign +1: the
    # upper bound), where x is the stationary point of the direction's hockey-stick
    # divergence. ``values``: evaluate(x), when already computed.
    def gap_pq(
        self, x: np.ndarray, target: float, sign: float, values: _Values | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """P(X > x) - L Q(X > x) - (target - sign e), and log L, L = p~/q at x."""
        cdf, pdf = self.evaluate(x) if values is None else values
        z = (x + self.mu) / self.s
        # L Q(X > x) = p~ s sqrt(pi/2) erfcx(z / sqrt 2)   (Mills ratio, no overflow)
        tail_q = pdf * self.s * _SQRT_HALF_PI * special.erfcx(z / math.sqrt(2.0))
        log_l = self._log_ratio(x, pdf)
        return (1.0 - cdf) - tail_q - (target - sign * self.error), log_l

    def gap_qp(
        self, x: np.ndarray, target: float, sign: float, values: _Values | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Q(X <= x) - F~(x) / L  -  (target - sign e / L), and log L."""
        cdf, pdf = self.evaluate(x) if values is None else values
        z = (x + self.mu) / self.s
        log_l = self._log_ratio(x, pdf)
        with np.errstate(over="ignore", invalid="ignore"):
            inv_l = np.exp(-log_l)
        return special.ndtr(z) - cdf * inv_l - (target - sign * self.error * inv_l), log_l

    def log_ratio(self, x: np.ndarray, pdf: np.ndarray) -> np.ndarray:
        """log p~/q, NaN where p~ is below its noise floor."""
        return self._log_ratio(x, pdf)

    def _log_ratio(self, x: np.ndarray, pdf: np.ndarray) -> np.ndarray:
        solid = pdf > self.pdf_floor
        out = np.full(np.shape(pdf), np.nan)
        np.log(pdf, out=out, where=solid)
        return out - self.log_q(x)


class _Inversion(Inversion):
    """The inversion from scratch: phi as a product over the T steps (module docstring)."""

    def __init__(self, w: np.ndarray, q: np.ndarray, sigma: np.ndarray, delta: float) -> None:
        if np.any(np.abs(q - 0.5) < Q_NEAR_HALF):
            raise ValueError("a sample rate within Q_NEAR_HALF of 1/2")
        self.s = s = math.sqrt(float(np.dot(sigma * sigma, w * w)))
        self.mu = mu = float(np.dot(q, w))
        tail = ETA * delta
        self.a = s * float(special.ndtri(tail)) - mu  # centred coordinates from here on
        self.b = _chernoff_upper(w, q, s, tail) - mu
        span = self.b - self.a
        self.step = 2.0 * math.pi / span
        if not math.isfinite(span):
            raise OverflowError("no finite interval R")
        # truncation: the terms k >= M sum to at most a geometric series (module docstring)
        theta_min = math.sqrt(2.0 * (-math.log(tail) + 1.0)) / s
        m = math.ceil(theta_min / self.step - 0.5) + 1
        if m > _MAX_TERMS:
            raise OverflowError("too many frequencies")
        self.k = np.arange(m) + 0.5
        theta = self.k * self.step
        theta_m = (m + 0.5) * self.step
        ratio = math.exp(-s * s * self.step * theta_m)
        truncation = math.exp(-0.5 * (s * theta_m) ** 2) / (math.pi * (m + 0.5)) / (1.0 - ratio)
        re, im, _, _ = log_factors(w, q, self.step, m)
        re_sum = re.sum(axis=1)
        log_phi = re_sum + 1j * im.sum(axis=1) - 1j * theta * mu - 0.5 * (s * theta) ** 2
        self.phi = np.exp(log_phi)
        # rounding: pairwise sums of T terms, each off by a few ulps of its size and of its
        # angle; then the phases theta x (|x| <= span) and the M-term sums of evaluate()
        size = (np.abs(im).sum(axis=1) - re_sum) + theta * mu + 0.5 * (s * theta) ** 2  # re <= 0
        angles = _FP * (4.0 + PHASOR_CHARGE) * float(np.dot(g_q(q), w))
        rel = _FP * (size * (4.0 + PHASOR_CHARGE + math.log2(w.size + 1) + theta * float(w.max()))
                     + math.log2(m + 1) + 4.0 + theta * span) + theta * angles
        rounding = float(np.sum(np.abs(self.phi) * rel / self.k)) / math.pi
        self.error = 2.0 * tail + truncation + rounding  # |F - F~| on R (aliasing: one side)
        self.terms = m
        # densities below this are treated as noise (no likelihood ratio is read there)
        self.pdf_floor = 1e3 * self.error / s


def _root(fun, xs: np.ndarray, values: np.ndarray, decreasing: bool, s: float) -> float | None:
    """The root of ``fun`` in the bracket of the scan where it changes sign (last crossing)."""
    ok = np.isfinite(values)
    sign = values > 0 if decreasing else values < 0
    idx = np.nonzero(ok[:-1] & ok[1:] & sign[:-1] & ~sign[1:])[0]
    if idx.size != 1:
        return None
    i = int(idx[0])
    try:
        return float(optimize.brentq(lambda x: float(fun(np.asarray(x))), xs[i], xs[i + 1],
                                     xtol=_XTOL * s, rtol=4 * np.finfo(float).eps))
    except ValueError:  # pragma: no cover - the scan guarantees a sign change
        return None


def _epsilon(
    inv: _Inversion, delta: float, sign: float, xs: np.ndarray, scan: _Values
) -> float | None:
    """Epsilon whose approximate delta equals delta - sign * error (sign +1: upper bound);
    ``scan``: ``inv.evaluate(xs)`` on the scan points ``xs`` (shared by both signs)."""
    eps: list[float] = []
    g1, log_l = inv.gap_pq(xs, delta, sign, scan)
    finite = np.isfinite(log_l)
    if not finite.any():
        return None
    # the likelihood ratio must increase wherever the pdf is above its noise floor
    if np.any(np.diff(log_l[finite]) <= 0):
        return None
    region = finite & (log_l >= 0.0)
    if region.any():
        first = int(np.argmax(region))
        if g1[first] <= 0:  # below delta already at the first point with L >= 1
            eps.append(float(log_l[first]) if sign > 0 else 0.0)
        else:
            x1 = _root(
                lambda x: inv.gap_pq(x, delta, sign)[0], xs[first:], g1[first:], True, inv.s
            )
            if x1 is None:
                return None
            eps.append(float(inv.gap_pq(np.asarray(x1), delta, sign)[1]))
    g2, _ = inv.gap_qp(xs, delta, sign, scan)
    region = finite & (log_l <= 0.0)
    if region.any():
        last = len(xs) - int(np.argmax(region[::-1]))
        lo = int(np.argmax(region))
        if g2[last - 1] <= 0:  # below delta already at the last point with L <= 1
            eps.append(-float(log_l[last - 1]) if sign > 0 else 0.0)
        else:
            x2 = _root(lambda x: inv.gap_qp(x, delta, sign)[0], xs[lo:last], g2[lo:last],
                       False, inv.s)
            if x2 is None:
                return None
            eps.append(-float(inv.gap_qp(np.asarray(x2), delta, sign)[1]))
    if not eps:
        return None
    return max(max(eps), 0.0)


def fourier_solve(
    delta: float, w: np.ndarray, q: np.ndarray, sigma: np.ndarray, accuracy: float
) -> WeightedHeuristicResult | None:
    """Upper and lower bounds on the weighted heuristic epsilon at ``delta`` (module
    docstring), or ``None`` when they are not certified within ``accuracy`` relative.
    Inputs are trusted: w > 0, q in (0, 1], sigma > 0."""
    try:
        inv = _Inversion(w, q, sigma, delta)
    except (OverflowError, ValueError, FloatingPointError):
        return None
    if not inv.error < 1e-3 * delta:
        return None
    xs = np.linspace(inv.a, inv.b, _SCAN)
    scan = inv.evaluate(xs)
    upper = _epsilon(inv, delta, 1.0, xs, scan)
    lower = _epsilon(inv, delta, -1.0, xs, scan)
    if upper is None or lower is None or not lower <= upper:
        return None
    rel = (upper - lower) / upper if upper > 0 else 0.0
    if rel > accuracy:
        return None
    return WeightedHeuristicResult(
        float(upper), float(lower), float(rel), accuracy, False, 0, inv.terms, 0.0,
        int(w.size), "epsilon", delta,
    )  # fmt: skip
