"""Hockey-stick divergences between a mixture of shifted Gaussians and one Gaussian.

    P = sum_k w_k N(x_k, s^2)   (x_k >= 0, sum_k w_k = 1 - m, m = truncated mass)
    Q = N(0, s^2)

is the pair behind the last-iterate heuristic (``docs/last_iterate.md``, "How we compute
it"): x_k is the number of times (or the total weight with which) the canary entered the
final model.
The privacy loss ln p/q at output y is

    L(y) = log sum_k exp(a_k y + b_k),   a_k = x_k / s^2,   b_k = log w_k - x_k^2 / (2 s^2),

which is convex and increasing, so both optimal sets are half-lines and every quantity below
is a one-dimensional root find. All sums are taken in log space (log-sum-exp of ``log_ndtr``
terms); a delta is formed as exp(A) * (-expm1(B - A)) to keep its relative precision.

Direction P||Q uses S = [y, inf), eps = L(y):
    delta_PQ(y) = sum_k w_k Pr[N(x_k, s^2) >= y] - e^{L(y)} Pr[N(0, s^2) >= y]
Direction Q||P uses S = (-inf, y], eps = -L(y):
    delta_QP(y) = Pr[N(0, s^2) <= y] - e^{-L(y)} sum_k w_k Pr[N(x_k, s^2) <= y]

The truncated mass m is added to delta_PQ (H(P,Q) <= H(P_kept,Q) + m), while
H(Q,P) <= H(Q,P_kept) needs no correction, so reported deltas are upper bounds and reported
epsilons are never below the exact value of the untruncated pair.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special

__all__ = ["ShiftedGaussianMixture"]

_XTOL = 1e-14
_NEWTON_ACCEPT = 1e-9  # a warm Newton step this small is the last one (see _newton)
_LOG_FLOOR = -2000.0  # log of a delta that underflows; keeps root brackets finite
_LINEAR_TAIL_FLOOR = 1e-280  # see ShiftedGaussianMixture._log_tail


def _lse(v: np.ndarray) -> float:
    m = float(v.max())
    if m == -math.inf:
        return -math.inf
    return m + math.log(float(np.exp(v - m).sum()))


def _decreasing_root(
    fun: Callable[[float], tuple[float, float]],
    lo: float,
    hi: float,
    xtol: float,
    start: float | None = None,
) -> float:
    """Root of a decreasing function on [lo, hi] (fun(lo) > 0 > fun(hi)) by Newton steps
    safeguarded with bisection; ``fun`` returns (value, derivative). Newton starts at ``hi``
    (or at ``start``, a warm start inside the bracket): for the concave log-deltas below it
    then approaches the root monotonically (from the left, the first step overshoots to the
    right of the root, and the rest is monotone)."""
    y = start if start is not None and lo < start < hi else hi
    for _ in range(200):
        f, df = fun(y)
        if f > 0:
            lo = y
        else:
            hi = y
        step = f / df if df < 0 and math.isfinite(df) else math.nan
        new = y - step
        if abs(step) <= xtol:  # converged (checked first: a step below one ulp lands on hi)
            return new
        if not (lo < new < hi):  # Newton left the bracket (or had no slope): bisect
            new = 0.5 * (lo + hi)
        if abs(new - y) <= xtol or hi - lo <= xtol:
            return new
        y = new
    return y  # pragma: no cover


def _newton(
    fun: Callable[[float], tuple[float, float]], target: float, start: float
) -> float | None:
    """Root of the strictly monotone fun(y) - target by Newton from a warm start: the root
    to within 1e-14 (1 + |y|), or None if six steps do not get there, the steps stop
    shrinking, or a value is not finite.

    A step of relative size <= 1e-9 is accepted without another evaluation: Newton's error
    after it is about |f''/(2 f')| step^2 <= 1e-18 (1 + |y|)^2 |f''/(2 f')|, far below the
    tolerance for these smooth log-deltas (curvature of order 1/s); at large T the warm start
    lands there at once (steps of 1e-11..1e-13), which saves one evaluation per step."""
    y, previous = start, math.inf
    for _ in range(6):
        value, slope = fun(y)
        if not (math.isfinite(value) and math.isfinite(slope) and slope != 0.0):
            return None
        step = (value - target) / slope
        y -= step
        if abs(step) <= _NEWTON_ACCEPT * (1.0 + abs(y)):
            return y
        if abs(step) >= previous:
            return None
        previous = abs(step)
    return None


def _log_diff(a: float, b: float) -> float:
    """log(e^a - e^b) for a > b; -inf when the difference vanishes."""
    if not b < a:
        return -math.inf
    return a + math.log(-math.expm1(b - a))


class ShiftedGaussianMixture:
    """The pair (P, Q) above, with ``epsilon(delta)`` and ``delta(epsilon)`` methods.

    Args:
        shifts: the means x_k >= 0 of P's components.
        log_weights: their log-probabilities (may sum to less than one).
        scale: the common standard deviation s > 0.
        dropped_mass: probability mass of P left out of ``shifts`` (added to delta).
    """

    __slots__ = (
        "_a", "_b", "_loss_floor", "_lw", "_lw_max", "_m", "_s", "_w_rel", "_x",
        "_x_over_s",
    )

    def __init__(
        self,
        shifts: np.ndarray,
        log_weights: np.ndarray,
        scale: float,
        dropped_mass: float = 0.0,
    ) -> None:
        x = np.asarray(shifts, dtype=float)
        lw = np.asarray(log_weights, dtype=float)
        if x.shape != lw.shape or x.ndim != 1 or x.size == 0:
            raise ValueError("`shifts` and `log_weights` must be non-empty 1-D arrays of one shape.")
        if np.any(x < 0) or not np.all(np.isfinite(x)):
            raise ValueError("`shifts` must be finite and >= 0.")
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"`scale` must be in (0, inf), got {scale!r}.")
        keep = np.isfinite(lw)
        x, lw = x[keep], lw[keep]
        at_zero = lw[x == 0.0]
        log_w0 = _lse(at_zero) if at_zero.size else -math.inf
        self._set(x, lw, float(scale), float(dropped_mass), log_w0)

    @classmethod
    def _trusted(
        cls, shifts: np.ndarray, log_weights: np.ndarray, scale: float, dropped_mass: float
    ) -> ShiftedGaussianMixture:
        """The pair from arrays already known to be valid (finite, shifts >= 0 increasing and
        distinct, one shape), as built by :mod:`.canary_count`: the per-step path skips the
        checks above."""
        pair = cls.__new__(cls)
        log_w0 = float(log_weights[0]) if shifts[0] == 0.0 else -math.inf
        pair._set(shifts, log_weights, scale, dropped_mass, log_w0)
        return pair

    def _set(
        self, x: np.ndarray, lw: np.ndarray, scale: float, dropped_mass: float, log_w0: float
    ) -> None:
        self._x, self._lw, self._s, self._m = x, lw, scale, dropped_mass
        self._x_over_s = x / scale
        self._a = self._x_over_s / scale
        self._b = lw - 0.5 * self._x_over_s**2
        # the weights relative to the largest one, for tail sums in linear space
        self._lw_max = float(lw.max())
        self._w_rel = np.exp(lw - self._lw_max)
        # lim_{y -> -inf} L(y): log of the weight at shift 0 (or -inf if there is none).
        self._loss_floor = log_w0

    # -- privacy loss -------------------------------------------------------------------------
    def privacy_loss(self, y: float) -> float:
        """L(y) = ln p(y) / q(y)."""
        return _lse(self._a * y + self._b)

    def _loss_and_slope(self, y: float) -> tuple[float, float]:
        v = self._a * y + self._b
        m = float(v.max())
        e = np.exp(v - m)
        tot = float(e.sum())
        return m + math.log(tot), float(e.dot(self._a)) / tot

    def _loss_inverse(self, value: float, start: float | None = None) -> float:
        """The y with L(y) = value (requires value > lim_{y->-inf} L); ``start``: a warm start.

        Newton on the convex increasing L converges monotonically from any point right of
        the root, and from the left its first step lands right of the root. A step of
        relative size <= 1e-9 is the last one (error about |L''/(2 L')| step^2, as in
        :func:`_newton`)."""
        cold = not (start is not None and math.isfinite(start))
        y = self._cold_start(value) if cold else float(start)  # type: ignore[arg-type]
        previous = math.inf
        for _ in range(200):
            loss, slope = self._loss_and_slope(y)
            if not (slope > 0.0 and math.isfinite(loss)) and not cold:
                # far left, all weight sits on the shift-0 component and the slope underflows
                # to 0: a warm start there is useless, so start cold (the slope is > 0 there)
                y, previous, cold = self._cold_start(value), math.inf, True
                continue
            step = (loss - value) / slope
            y -= step
            # converged, or the steps stopped shrinking: rounding noise of L (a warm start
            # can land there at once, where the cold start's monotone path stops by itself)
            if abs(step) <= _NEWTON_ACCEPT * (1.0 + abs(y)) or abs(step) >= previous > 0:
                break
            previous = abs(step)
        return y

    def _cold_start(self, value: float) -> float:
        """A point right of the root of L(y) = value: L(y) >= a_k y + b_k for every k."""
        pos = self._a > 0
        return float(np.min((value - self._b[pos]) / self._a[pos]))

    # -- log tail probabilities ----------------------------------------------------------------
    def _log_tail(self, z: np.ndarray) -> float:
        """log sum_k w_k Phi(z_k). Summed in linear space, sum_k (w_k / w_max) Phi(z_k), when
        that sum is >= 1e-280: each term that underflows there is below 1e-308, so all of
        them together are below 1e-17 of the sum and the result keeps its relative
        precision; otherwise in log space (log-sum-exp of ``log_ndtr``)."""
        total = float(self._w_rel.dot(special.ndtr(z)))
        if total >= _LINEAR_TAIL_FLOOR:
            return self._lw_max + math.log(total)
        return _lse(self._lw + special.log_ndtr(z))

    def _log_delta_pq(self, y: float) -> tuple[float, float]:
        """log delta_PQ(y) and its derivative -L'(y) e^{L(y)} Pr[N(0,s^2) >= y] / delta_PQ."""
        s = self._s
        loss, slope = self._loss_and_slope(y)
        log_p_upper = self._log_tail(self._x_over_s - y / s)
        log_q_upper = float(special.log_ndtr(-y / s))
        log_delta = _log_diff(log_p_upper, loss + log_q_upper)
        return log_delta, -slope * math.exp(min(loss + log_q_upper - log_delta, 700.0))

    def _log_delta_qp(self, y: float) -> tuple[float, float]:
        """log delta_QP(y) and its derivative L'(y) e^{-L(y)} Pr_P[Y <= y] / delta_QP."""
        loss, slope = self._loss_and_slope(y)
        log_delta, log_p_lower = self._log_delta_qp_at(y, loss)
        return log_delta, slope * math.exp(min(log_p_lower - loss - log_delta, 700.0))

    def _log_delta_qp_at(self, y: float, loss: float) -> tuple[float, float]:
        """(log delta_QP(y), log Pr_P[Y <= y]) given loss = L(y): a threshold found as the
        root of L(y) = -eps needs no second pass over L."""
        log_q_lower = float(special.log_ndtr(y / self._s))
        log_p_lower = self._log_tail(y / self._s - self._x_over_s)
        return _log_diff(log_q_lower, log_p_lower - loss), log_p_lower

    # -- public API ----------------------------------------------------------------------------
    @property
    def dropped_mass(self) -> float:
        return self._m

    def delta(self, epsilon: float) -> float:
        """delta(eps) = max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)), an upper bound (see module)."""
        y1 = self._loss_inverse(epsilon)
        delta_pq = math.exp(self._log_delta_pq(y1)[0]) + self._m
        delta_qp = 0.0
        if -epsilon > self._loss_floor:
            y2 = self._loss_inverse(-epsilon)
            delta_qp = math.exp(self._log_delta_qp_at(y2, -epsilon)[0])
        return min(1.0, max(delta_pq, delta_qp))

    def epsilon(self, delta: float) -> float:
        """eps(delta) = min{eps >= 0 : delta(eps) <= delta} = max(eps_PQ, eps_QP)."""
        return self.epsilon_warm(delta, None)[0]

    def epsilon_warm(
        self, delta: float, hints: tuple[float, float, float] | None
    ) -> tuple[float, tuple[float, float, float]]:
        """:meth:`epsilon` started from the thresholds ``hints`` = (y0, y_PQ, y_QP) of a nearby
        pair (the previous step of a run); returns the epsilon and this pair's thresholds.
        Warm starts change the number of Newton steps only, not the tolerance of the root."""
        if hints is not None and all(math.isfinite(h) for h in hints):
            fast = self._epsilon_near(delta, hints)
            if fast is not None:
                return fast
        h0, hpq, hqp = hints if hints is not None else (None, None, None)
        y0 = self._loss_inverse(0.0, h0)  # L(y0) = 0: both optimal sets start here at eps = 0
        eps_pq, ypq = self._epsilon_pq(delta, y0, hpq)
        if 0.0 < eps_pq < math.inf and -eps_pq > self._loss_floor:
            # delta_QP is decreasing in eps: if delta_QP(eps_PQ) <= delta then
            # eps_QP <= eps_PQ, and one evaluation replaces the second root find.
            y_at = self._loss_inverse(-eps_pq, hqp)
            if self._log_delta_qp_at(y_at, -eps_pq)[0] <= math.log(delta):
                return eps_pq, (y0, ypq, y_at)
        eps_qp, yqp = self._epsilon_qp(delta, y0, hqp)
        return max(eps_pq, eps_qp), (y0, ypq, yqp)

    def _epsilon_near(
        self, delta: float, hints: tuple[float, float, float]
    ) -> tuple[float, tuple[float, float, float]] | None:
        """The warm path of :meth:`epsilon_warm`: Newton from the hints without a bracket.

        delta_PQ(y) is strictly decreasing and delta_QP(y) strictly increasing in y (their
        derivatives are -L' e^L Pr_Q[Y >= y] and L' e^-L Pr_P[Y <= y]), so a converged
        Newton iteration has found the unique root that the bracketed path finds, to the
        same tolerance. Returns None (and the caller takes the bracketed path) when Newton
        does not converge quickly, when eps would be 0, or when the truncated mass exceeds
        delta."""
        h0, hpq, hqp = hints
        target = delta - self._m
        if target <= 0:
            return None
        log_target, log_delta = math.log(target), math.log(delta)
        ypq = _newton(lambda y: self._log_delta_pq(y), log_target, hpq)
        if ypq is None:
            return None
        eps_pq = self.privacy_loss(ypq)
        if not (eps_pq > 0.0 and -eps_pq > self._loss_floor):
            return None
        y_at = self._loss_inverse(-eps_pq, hqp)
        if self._log_delta_qp_at(y_at, -eps_pq)[0] <= log_delta:  # eps_QP <= eps_PQ
            return eps_pq, (h0, ypq, y_at)
        yqp = _newton(lambda y: self._log_delta_qp(y), log_delta, y_at)
        if yqp is None:
            return None
        eps_qp = -self.privacy_loss(yqp)
        return (eps_qp, (h0, ypq, yqp)) if eps_qp > eps_pq else None

    def _epsilon_pq(
        self, delta: float, y0: float, start: float | None = None
    ) -> tuple[float, float]:
        target = delta - self._m
        if target <= 0:
            return math.inf, math.inf
        log_target = math.log(target)
        if self._log_delta_pq(y0)[0] <= log_target:
            return 0.0, y0
        # delta_PQ(y) <= Pr[N(x_max, s^2) >= y] <= target / 4 at y_hi.
        y_hi = max(y0, float(self._x.max()) - self._s * float(special.ndtri(target / 4.0)))

        def f(y: float) -> tuple[float, float]:
            log_delta, slope = self._log_delta_pq(y)
            return max(log_delta, _LOG_FLOOR) - log_target, slope

        y = _decreasing_root(f, y0, y_hi, _XTOL * (1.0 + abs(y_hi)), start)
        return max(0.0, self.privacy_loss(y)), y

    def _epsilon_qp(
        self, delta: float, y0: float, start: float | None = None
    ) -> tuple[float, float]:
        log_target = math.log(delta)
        if self._log_delta_qp(y0)[0] <= log_target:
            return 0.0, y0
        # delta_QP(y) <= Pr[N(0, s^2) <= y] = delta / 4 at y_lo.
        y_lo = min(y0, self._s * float(special.ndtri(delta / 4.0)))

        def g(y: float) -> tuple[float, float]:  # decreasing in -y
            log_delta, slope = self._log_delta_qp(-y)
            return max(log_delta, _LOG_FLOOR) - log_target, -slope

        neg_start = None if start is None else -start
        y = -_decreasing_root(g, -y0, -y_lo, _XTOL * (1.0 + abs(y_lo)), neg_start)
        return max(0.0, -self.privacy_loss(y)), y

    def beta(self, alpha: float) -> float:
        """Trade-off T(P, Q)(alpha): the smallest false-negative rate Pr_P[say Q] of a test
        whose false-positive rate Pr_Q[say P] is ``alpha`` (Neyman-Pearson: say P when y >= tau,
        tau = s Phi^{-1}(1 - alpha), since L is increasing). The truncated mass is counted as
        detected, so the value is a lower bound (the safe side for privacy)."""
        if alpha <= 0.0:
            return float(1.0 - self._m) if self._x.size else 1.0
        if alpha >= 1.0:
            return 0.0
        tau = -self._s * float(special.ndtri(alpha))
        log_beta = self._log_tail(tau / self._s - self._x_over_s)
        return min(1.0, math.exp(log_beta))
