"""Independent reference computations for the heuristic (used by tests only).

The package computes hockey-stick divergences from closed-form normal tails at the optimal
threshold. Here we instead integrate the positive part of the density difference,
``integral max(p(y) - e^eps q(y), 0) dy`` (and the other direction), by adaptive
Gauss-Kronrod quadrature over the *untruncated* binomial mixture, and invert by bisection.
Nothing is shared with the package's code path except numpy/scipy primitives.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy import integrate, optimize, special, stats


class QuadratureHeuristic:
    def __init__(self, steps: int, q: float, sigma: float, weights=None, shifts=None):
        if shifts is None:
            k = np.arange(steps + 1)
            w = stats.binom.pmf(k, steps, q)
            keep = w > 1e-60  # the dropped tail (< 1e-55) is far below any delta tested
            shifts, weights = k[keep].astype(float), w[keep]
        self.x = np.asarray(shifts, float)
        self.w = np.asarray(weights, float)
        self.s = sigma * math.sqrt(steps)
        self.lo = -40.0 * self.s
        self.hi = float(self.x.max()) + 40.0 * self.s

    def p(self, y: float) -> float:
        z = (y - self.x) / self.s
        return float(np.dot(self.w, np.exp(-0.5 * z * z))) / (self.s * math.sqrt(2 * math.pi))

    def q(self, y: float) -> float:
        return math.exp(-0.5 * (y / self.s) ** 2) / (self.s * math.sqrt(2 * math.pi))

    def _integrate(self, f, a: float, b: float) -> float:
        edges = np.linspace(a, b, max(2, int((b - a) / self.s) + 2))
        return sum(
            integrate.quad(f, u, v, epsabs=0.0, epsrel=1e-12, limit=200)[0]
            for u, v in itertools.pairwise(edges)
        )

    def _crossing(self, c: float) -> float | None:
        """Where log p - log q = c (direct densities, bisection), None if never."""
        def g(y):
            pv, qv = self.p(y), self.q(y)
            if qv == 0.0:
                return math.inf
            if pv == 0.0:
                return -math.inf
            return math.log(pv) - math.log(qv) - c
        a, b = -10.0 * self.s - 10.0, float(self.x.max()) + 10.0 * self.s + 10.0
        while g(b) < 0 and b < 35.0 * self.s + float(self.x.max()):
            b += 5.0 * self.s
        if g(a) > 0 or g(b) < 0:
            return None
        return optimize.brentq(g, a, b, xtol=1e-13, rtol=1e-14, maxiter=500)

    def delta(self, eps: float) -> float:
        e = math.exp(eps)
        y1 = self._crossing(eps)
        d_pq = 0.0  # None: p > e^eps q only beyond 35 s, where both densities are < e^-600
        if y1 is not None:
            d_pq = self._integrate(
                lambda y: max(self.p(y) - e * self.q(y), 0.0), y1, max(self.hi, y1 + 40.0 * self.s)
            )
        y2 = self._crossing(-eps)
        d_qp = 0.0
        if y2 is not None:
            d_qp = self._integrate(lambda y: max(self.q(y) - e * self.p(y), 0.0), self.lo, y2)
        return max(d_pq, d_qp)

    def epsilon(self, delta: float) -> float:
        if self.delta(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self.delta(hi) > delta:
            hi *= 2.0
        return optimize.brentq(
            lambda e: math.log(max(self.delta(e), 1e-300)) - math.log(delta),
            0.0, hi, xtol=1e-12, rtol=1e-11,
        )


# -- the weighted heuristic by enumeration ------------------------------------------------------


def enumerate_weighted_shifts(weights, rates) -> tuple[np.ndarray, np.ndarray]:
    """All 2^T inclusion patterns b of T steps: shifts sum_t b_t w_t, probabilities
    prod_t q_t^b_t (1 - q_t)^(1 - b_t) (itertools; no convolution)."""
    w = np.asarray(weights, float)
    q = np.broadcast_to(np.asarray(rates, float), w.shape)
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    keep = probs > 0
    return bits[keep] @ w, probs[keep]


def weighted_heuristic_quadrature(weights, rates, sigmas, delta: float) -> float:
    """Exact weighted heuristic epsilon of P = sum_t w_t Bernoulli(q_t) + N(0, s^2) against
    Q = N(0, s^2), s^2 = sum_t w_t^2 sigma_t^2, by 2^T enumeration and the quadrature of
    :class:`QuadratureHeuristic` (weights rescaled to a largest weight of 1, which leaves the
    pair's epsilon unchanged and keeps the quadrature's grid on the noise scale)."""
    w = np.asarray(weights, float)
    w = w / w.max()
    sigma = np.broadcast_to(np.asarray(sigmas, float), w.shape)
    x, p = enumerate_weighted_shifts(w, rates)
    s = math.sqrt(float(np.sum((w * sigma) ** 2)))
    return QuadratureHeuristic(1, 0.5, s, weights=p, shifts=x).epsilon(delta)


def torch_sgd_weights(lrs, momentum: float = 0.0, weight_decay: float = 0.0) -> np.ndarray:
    """w_s = -(final parameter) after running ``torch.optim.SGD`` on one scalar parameter,
    from 0, with gradient 1 at step s and 0 at every other step, learning rate ``lrs[t]`` at
    step t: the weight with which step s's noisy gradient enters the final model (torch's
    own update rule, nothing from the package; the model is linear in the gradients, so
    weight decay lambda is the quadratic regulariser lambda m^2 / 2)."""
    import torch

    out = []
    for s in range(len(lrs)):
        p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD(
            [p], lr=float(lrs[0]), momentum=momentum, weight_decay=weight_decay
        )
        for t, lr in enumerate(lrs):
            opt.param_groups[0]["lr"] = float(lr)
            p.grad = torch.tensor([1.0 if t == s else 0.0], dtype=torch.float64)
            opt.step()
        out.append(-float(p.detach()[0]))
    return np.array(out)


def frozen_adamw_weights(lrs, *, noise_std, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """w_s = -(final parameter) of AdamW on one scalar from 0, written out in numpy from the
    update rule (decoupled decay, bias-corrected moments), with the second moment frozen at
    its expectation under N(0, noise_std^2) gradients and gradient 1 at step s, 0 at every
    other step: the frozen-second-moment weights of the adaptive heuristic, computed without
    the package."""
    lrs = np.asarray(lrs, float)
    steps = lrs.size
    v = np.empty(steps)
    acc = 0.0
    for t in range(steps):
        acc = beta2 * acc + (1 - beta2) * noise_std**2
        v[t] = acc
    out = np.empty(steps)
    for impulse in range(steps):
        p = m = 0.0
        for t in range(steps):
            p *= 1 - lrs[t] * weight_decay
            m = beta1 * m + (1 - beta1) * (1.0 if t == impulse else 0.0)
            m_hat = m / (1 - beta1 ** (t + 1))
            p -= lrs[t] * m_hat / (math.sqrt(v[t] / (1 - beta2 ** (t + 1))) + eps)
        out[impulse] = -p
    return out


# -- closed-form hockey-stick of a shifted Gaussian mixture ----------------------------------


class ClosedFormMixture:
    """P = sum_j p_j N(x_j, s^2) against Q = N(0, s^2), shifts x_j >= 0, by the closed form:
    the likelihood ratio is increasing in y, so each hockey-stick divergence is a difference
    of normal tails at the single crossing (found with brentq on the log likelihood ratio).
    Written here from the definition (scipy primitives only); much faster than
    :class:`QuadratureHeuristic`, which it agrees with (``test_reference.py``)."""

    def __init__(self, shifts, probs, s: float) -> None:
        self.x = np.asarray(shifts, float)
        self.p = np.asarray(probs, float)
        self.lp = np.log(self.p)
        self.s = float(s)

    @classmethod
    def binomial(cls, steps: int, q: float, sigma: float) -> ClosedFormMixture:
        """The heuristic pair: Binomial(T, q) + N(0, sigma^2 T) against N(0, sigma^2 T)."""
        k = np.arange(steps + 1)
        w = stats.binom.pmf(k, steps, q)
        keep = w > 1e-60
        return cls(k[keep], w[keep], sigma * math.sqrt(steps))

    def _log_lr(self, y: float) -> float:
        z = self.lp + (self.x * y - 0.5 * self.x**2) / self.s**2
        m = float(z.max())
        return m + math.log(float(np.sum(np.exp(z - m))))

    def _crossing(self, c: float) -> float | None:
        g = lambda y: self._log_lr(y) - c  # noqa: E731
        lo, hi = -self.s, float(self.x.max()) + self.s
        while g(hi) < 0:
            hi = 2 * hi + self.s
        while g(lo) > 0:
            if lo < -1e6 * self.s:
                return None  # the ratio never goes below e^c
            lo = 2 * lo - self.s
        return optimize.brentq(g, lo, hi, xtol=1e-14 * self.s, rtol=1e-15, maxiter=500)

    def delta(self, eps: float) -> float:
        a, p, s = math.exp(eps), self.p, self.s
        y1 = self._crossing(eps)
        d_pq = float(np.dot(p, special.ndtr((self.x - y1) / s)) - a * special.ndtr(-y1 / s))
        y2 = self._crossing(-eps)
        d_qp = 0.0
        if y2 is not None:
            d_qp = float(special.ndtr(y2 / s) - a * np.dot(p, special.ndtr((y2 - self.x) / s)))
        return max(d_pq, d_qp, 0.0)

    def epsilon(self, delta: float) -> float:
        if self.delta(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self.delta(hi) > delta:
            hi *= 2.0
        return optimize.brentq(
            lambda e: math.log(max(self.delta(e), 1e-300)) - math.log(delta),
            0.0, hi, xtol=1e-13, rtol=1e-13,
        )


def gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """Epsilon of the Gaussian mechanism with sensitivity / noise = mu (Balle and Wang 2018,
    Theorem 8: delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2))."""

    def d(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2))

    if d(0.0) <= delta:
        return 0.0
    hi = 1.0
    while d(hi) > delta:
        hi *= 2.0
    return optimize.brentq(lambda e: d(e) - delta, 0.0, hi, xtol=1e-14, rtol=1e-14)
