"""Every route of the weighted heuristic against an independent computation of the exact value.

The routes (``docs/last_iterate.md``, "Weighted heuristic without a grid"; the engine
:class:`IncrementalWeightedHeuristic` asks them in this order):

* ``kept``: the characteristic function kept step by step (``IncrementalCharacteristic``),
  asked after every step of the run (its first query builds it from scratch, as the engine's
  fallback does where the kept one declines);
* ``grid``: the weight grid from scratch (``weighted_heuristic_epsilon_result`` and
  ``weighted_heuristic_delta_result``), the fallback for every case the characteristic
  function declines (a sample rate within 0.01 of 1/2, weight decay, a large epsilon);
* ``engine``: the dispatch itself, on the same cases.

The reference, written here from the definition and sharing no code with the package: the
pair P = sum_t w_t Bernoulli(q_t) + N(0, s^2), Q = N(0, s^2), s^2 = sum_t sigma_t^2 w_t^2, with
the law of the weighted sum enumerated over all 2^T inclusion patterns (T <= 12), or, for one
longer run, computed by a dynamic program on a lattice of spacing h with every weight rounded
up (and, separately, down) to the lattice: by stochastic domination the two give an upper and a
lower bound on the exact value. P's likelihood ratio against Q increases in the output, so
each hockey-stick divergence is a supremum over half-lines, attained where the log-likelihood
ratio L(y) equals +eps (P -> Q) or -eps (Q -> P); delta(eps) is the larger of the two, and
eps(delta) is read by following the stationary point: y -> (L(y), divergence at y) is
monotone, and one scalar root in y gives each direction's epsilon. Every sum is in log space;
roots to 1e-13 relative, so the enumerated reference is good to about 1e-10 relative
(``REF``).

Tolerances: a route certifies an upper value and a lower bound with
(upper - lower) / upper <= ``ACC``. So the exact epsilon must lie in [lower, upper] (widened by
``REF``), the exact delta at the route's upper epsilon must be at most the target delta and at
its lower epsilon at least it (the upper value is on the safe side), and upper <= exact / (1 -
ACC). A 10x looser delta moves an epsilon by far more than ``ACC`` in every case here, so the
checks fail for it in each route.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize, special

from opacus_lastiterate.analysis.last_iterate.incremental_fourier import IncrementalCharacteristic
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import cosine_schedule, sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_delta_result,
    weighted_heuristic_epsilon_result,
)

ACC = 1e-3  # the accuracy asked of every route (the accountant's default)
REF = 1e-10  # relative accuracy of the enumerated reference
DELTAS = (1e-5, 1e-3)
EPSILONS = (0.5, 2.0)

# -- the reference -------------------------------------------------------------------------


class Pair:
    """P = sum_k p_k N(x_k, s^2) against Q = N(0, s^2), x_k >= 0, from atoms (x_k, log p_k)."""

    def __init__(self, x: np.ndarray, log_p: np.ndarray, s: float) -> None:
        keep = np.isfinite(log_p)
        self.x, self.log_p, self.s = x[keep] / s, log_p[keep], 1.0  # in units of s
        zero = self.x == 0.0
        self.log_p0 = special.logsumexp(self.log_p[zero]) if zero.any() else -math.inf

    def log_ratio(self, y: float) -> float:
        """L(y) = log dP/dQ at y."""
        return float(special.logsumexp(self.log_p + self.x * y - 0.5 * self.x * self.x))

    def _pq(self, y: float, eps: float) -> float:
        """P(Y > y) - e^eps Q(Y > y)."""
        a = float(special.logsumexp(self.log_p + special.log_ndtr(self.x - y)))
        b = eps + float(special.log_ndtr(-y))
        return math.exp(a) * -math.expm1(b - a) if a > b else -math.exp(b) * -math.expm1(a - b)

    def _qp(self, y: float, eps: float) -> float:
        """Q(Y <= y) - e^eps P(Y <= y)."""
        a = float(special.log_ndtr(y))
        b = eps + float(special.logsumexp(self.log_p + special.log_ndtr(y - self.x)))
        return math.exp(a) * -math.expm1(b - a) if a > b else -math.exp(b) * -math.expm1(a - b)

    def _where(self, level: float) -> float:
        """The y with L(y) = level (L increases from log_p0 to infinity)."""
        lo, hi = -1.0, 1.0
        for _ in range(60):
            if self.log_ratio(lo) < level:
                break
            lo *= 2.0
        for _ in range(60):
            if self.log_ratio(hi) > level:
                break
            hi *= 2.0
        return optimize.brentq(lambda y: self.log_ratio(y) - level, lo, hi, xtol=1e-14, rtol=1e-15)

    def delta(self, eps: float) -> float:
        """max(H_{e^eps}(P, Q), H_{e^eps}(Q, P))."""
        pq = max(0.0, self._pq(self._where(eps), eps))
        qp = 0.0 if self.log_p0 >= -eps else max(0.0, self._qp(self._where(-eps), eps))
        return max(pq, qp)

    def epsilon(self, delta: float) -> float:
        """The least eps >= 0 with delta(eps) <= delta."""
        out = 0.0
        y0 = self._where(0.0)
        # P -> Q: at the stationary point y (L(y) = eps), the divergence decreases in y
        if self._pq(y0, 0.0) > delta:
            hi = y0 + 1.0
            while self._pq(hi, self.log_ratio(hi)) > delta:
                hi = y0 + 2.0 * (hi - y0)
            y = optimize.brentq(lambda v: self._pq(v, self.log_ratio(v)) - delta, y0, hi,
                                xtol=1e-13, rtol=1e-15)  # fmt: skip
            out = max(out, self.log_ratio(y))
        # Q -> P: at y (L(y) = -eps), the divergence decreases as y decreases
        if self._qp(y0, 0.0) > delta:
            lo = y0 - 1.0
            while self.log_ratio(lo) > self.log_p0 + 1e-12 and self._qp(lo, -self.log_ratio(lo)) > delta:
                lo = y0 - 2.0 * (y0 - lo)
            y = optimize.brentq(lambda v: self._qp(v, -self.log_ratio(v)) - delta, lo, y0,
                                xtol=1e-13, rtol=1e-15)  # fmt: skip
            out = max(out, -self.log_ratio(y))
        return out


def enumerated(w: np.ndarray, q: np.ndarray, sigma: np.ndarray) -> Pair:
    """The exact pair, the weighted sum enumerated over its 2^T inclusion patterns."""
    bits = np.array(list(itertools.product((False, True), repeat=w.size)))
    with np.errstate(divide="ignore"):  # q = 1: patterns of probability 0
        log_p = np.where(bits, np.log(q), np.log1p(-q)).sum(axis=1)
    return Pair(bits @ w, log_p, math.sqrt(float(np.sum((sigma * w) ** 2))))


def lattice(w: np.ndarray, q: np.ndarray, sigma: np.ndarray, h: float, up: bool) -> Pair:
    """The pair with each weight rounded up (``up``) or down to a multiple of h, the law of the
    rounded sum by a dynamic program over the steps (non-negative sums only); the noise is
    never rounded. Up: an upper bound on both divergences; down: a lower bound."""
    units = np.ceil(w / h) if up else np.floor(w / h)
    p = np.ones(1)
    for k, rate in zip(units.astype(int).tolist(), q.tolist(), strict=True):
        nxt = np.zeros(p.size + k)
        nxt[: p.size] += (1.0 - rate) * p
        nxt[k:] += rate * p
        p = nxt
    keep = p > 0.0
    return Pair(h * np.flatnonzero(keep), np.log(p[keep]), math.sqrt(float(np.sum((sigma * w) ** 2))))


# -- the cases -------------------------------------------------------------------------------

T = 12
RNG = np.random.default_rng(20261127)
# name: (learning rates, sample rates, noise multipliers, (momentum, dampening, nesterov))
CASES = {
    "constant": (np.full(T, 0.1), np.full(T, 0.1), np.full(T, 1.0), (0.0, 0.0, False)),
    "momentum": (np.full(T, 0.1), np.full(T, 0.05), np.full(T, 0.8), (0.9, 0.0, False)),
    "momentum-cosine": (cosine_schedule(0.1, T), np.full(T, 0.2), np.full(T, 1.0), (0.9, 0.0, False)),
    "nesterov": (cosine_schedule(0.1, T), np.full(T, 0.1), np.full(T, 1.2), (0.7, 0.0, True)),
    "dampening": (cosine_schedule(0.1, T), np.full(T, 0.1), np.full(T, 1.2), (0.8, 0.3, False)),
    "varying-q-sigma": (cosine_schedule(0.1, T), RNG.uniform(0.01, 0.4, T), RNG.uniform(0.6, 1.5, T),
                        (0.5, 0.0, False)),
    "large-q": (RNG.uniform(0.02, 0.2, T), RNG.choice([0.8, 0.95, 1.0], T), RNG.uniform(2.0, 4.0, T),
                (0.9, 0.0, False)),
}  # fmt: skip
NEAR_HALF = {
    "q-half": (cosine_schedule(0.1, 10), np.full(10, 0.5), np.full(10, 2.0), (0.9, 0.0, False)),
    "q-near-half": (cosine_schedule(0.1, 10), np.full(10, 0.495), np.full(10, 1.5), (0.9, 0.0, False)),
}  # fmt: skip


def weights(lrs: np.ndarray, opt: tuple[float, float, bool]) -> np.ndarray:
    beta, damp, nesterov = opt
    return sgd_weights(lrs, momentum=beta, dampening=damp, nesterov=nesterov)


def check_epsilon(upper: float, lower: float, pair: Pair, delta: float, exact: float) -> None:
    """The route's bracket [lower, upper] at ``delta`` against the exact epsilon."""
    assert lower <= upper
    assert (upper - lower) <= ACC * upper
    assert lower * (1 - REF) - REF <= exact <= upper * (1 + REF) + REF
    assert upper <= exact / (1 - ACC) + REF
    # the same in delta: at the upper epsilon the exact delta is at most the target, at the
    # lower one at least it (unless epsilon is 0)
    assert pair.delta(upper) <= delta * (1 + 1e-8)
    if lower > 0:
        assert pair.delta(lower) >= delta * (1 - 1e-8)


# -- the routes ------------------------------------------------------------------------------


# the kept route declines these after its first query (its frequency grid, placed with a
# Chernoff bound that charges the growth of steps frozen at sample rates near 1, no longer
# fits): the engine answers them with a new instance per query (test_engine_after_every_step)
KEPT_DECLINES = {"large-q"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_kept_route_after_every_step(name: str) -> None:
    lrs, q, sigma, opt = CASES[name]
    for delta in DELTAS:
        char = IncrementalCharacteristic(*opt)
        for t in range(1, T + 1):
            got = char.solve(delta, lrs[:t].tolist(), sigma[:t].tolist(), q[:t].tolist(), ACC)
            if name in KEPT_DECLINES and t > 1:
                continue
            if t in (1, 2, 5, T):
                assert got is not None, (t, delta)
                pair = enumerated(weights(lrs[:t], opt), q[:t], sigma[:t])
                check_epsilon(got[0], got[1], pair, delta, pair.epsilon(delta))


@pytest.mark.parametrize("name", sorted(CASES) + sorted(NEAR_HALF))
def test_grid_from_scratch_epsilon_and_delta(name: str) -> None:
    lrs, q, sigma, opt = {**CASES, **NEAR_HALF}[name]
    w = weights(lrs, opt)
    pair = enumerated(w, q, sigma)
    kw = {"weights": w, "sample_rates": q, "noise_multipliers": sigma, "accuracy": ACC}
    for delta in DELTAS:
        got = weighted_heuristic_epsilon_result(delta, **kw)
        check_epsilon(got.epsilon, got.lower_bound, pair, delta, pair.epsilon(delta))
    for eps in EPSILONS:
        got = weighted_heuristic_delta_result(eps, **kw)
        exact = pair.delta(eps)
        assert got.lower_bound * (1 - REF) <= exact <= got.value * (1 + REF)
        assert got.value - got.lower_bound <= ACC * got.value
        assert got.value <= exact / (1 - ACC)


@pytest.mark.parametrize("name", sorted(NEAR_HALF))
def test_kept_route_declines_near_half_and_the_engine_answers_on_the_grid(name: str) -> None:
    lrs, q, sigma, opt = NEAR_HALF[name]
    w = weights(lrs, opt)
    pair = enumerated(w, q, sigma)
    engine = IncrementalWeightedHeuristic(ACC)
    for t in range(lrs.size):
        engine.append(float(sigma[t]), float(q[t]), float(lrs[t]), *opt)
    for delta in DELTAS:
        assert IncrementalCharacteristic(*opt).solve(
            delta, lrs.tolist(), sigma.tolist(), q.tolist(), ACC
        ) is None
        got = engine.epsilon(delta)
        assert got.exact or got.resolution > 0  # answered on the weight grid
        check_epsilon(got.epsilon, got.lower_bound, pair, delta, pair.epsilon(delta))


@pytest.mark.parametrize("name", sorted(CASES) + ["weight-decay"])
def test_engine_after_every_step(name: str) -> None:
    """The dispatch answers every step: the kept route where it applies, the grid for weight
    decay (outside the Fourier routes' scope)."""
    lrs, q, sigma, opt = CASES["momentum-cosine" if name == "weight-decay" else name]
    decay = 0.05 if name == "weight-decay" else 0.0
    engine = IncrementalWeightedHeuristic(ACC)
    for t in range(1, T + 1):
        engine.append(float(sigma[t - 1]), float(q[t - 1]), float(lrs[t - 1]), *opt, decay)
        if t in (1, 6, T):
            beta, damp, nesterov = opt
            w = sgd_weights(lrs[:t], momentum=beta, dampening=damp, nesterov=nesterov,
                            weight_decay=decay)  # fmt: skip
            pair = enumerated(w, q[:t], sigma[:t])
            for delta in DELTAS:
                got = engine.epsilon(delta)
                on_grid = got.exact or got.resolution > 0
                assert on_grid == (decay > 0)  # the grid only for weight decay
                check_epsilon(got.epsilon, got.lower_bound, pair, delta, pair.epsilon(delta))


def test_longer_run_against_the_lattice_bracket() -> None:
    """200 steps of momentum 0.9 and a cosine schedule (the kept route freezes old steps):
    both routes' brackets against the lattice reference, whose rounding up and down brackets
    the exact value ([low, high], about 3e-3 wide at h = max w / 1024)."""
    n, delta = 200, 1e-5
    lrs = cosine_schedule(0.1, n)
    q, sigma, opt = np.full(n, 0.05), np.full(n, 1.0), (0.9, 0.0, False)
    w = weights(lrs, opt)
    h = float(w.max()) / 1024
    high = lattice(w, q, sigma, h, up=True).epsilon(delta)
    low = lattice(w, q, sigma, h, up=False).epsilon(delta)
    assert low <= high <= low * (1 + 5e-3)
    char = IncrementalCharacteristic(*opt)
    for t in range(1, n + 1):
        kept = char.solve(delta, lrs[:t].tolist(), sigma[:t].tolist(), q[:t].tolist(), ACC)
    assert kept is not None and char.frozen >= n // 4  # old steps frozen (80 of 200)
    grid = weighted_heuristic_epsilon_result(
        delta, weights=w, sample_rates=q, noise_multipliers=sigma, accuracy=ACC
    )
    for upper, lower in ((kept[0], kept[1]), (grid.epsilon, grid.lower_bound)):
        assert lower <= high * (1 + REF) and upper >= low * (1 - REF)
        assert upper <= high / (1 - ACC)
        assert upper - lower <= ACC * upper
