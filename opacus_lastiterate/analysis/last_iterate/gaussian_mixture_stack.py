"""Many mixture pairs on one integer grid, solved for epsilon together.

Lane b of the stack is the pair of :mod:`.gaussian_mixture` with shifts on a common grid,

    P_b = sum_k w_bk N(k, s_b^2),   Q_b = N(0, s_b^2),   k = offset .. offset + K - 1,

(w_bk = 0 outside lane b's support, a truncated mass m_b added to delta), as the heuristic
pairs of consecutive steps of a constant-rate run are: K_b ~ Binomial(T_b, q) on a window
that moves slowly with T_b. :meth:`MixtureStack.epsilons` runs the warm path of
:meth:`ShiftedGaussianMixture.epsilon_warm <.gaussian_mixture.ShiftedGaussianMixture.epsilon_warm>`
on every lane at once: Newton from the caller's thresholds on log delta_PQ(y) = log(delta -
m_b), eps_PQ = L_b(y_PQ), then the one evaluation that shows delta_QP(eps_PQ) <= delta (so
eps = eps_PQ). The equations, the acceptance rule of a step (relative size <= 1e-9) and the
roots' tolerance are those of the one-pair path; only the order of floating-point sums
differs, so the two agree to the root finder's tolerance (about 1e-12 relative in epsilon).

A lane is left *unsolved* (the caller solves it alone, cold or warm) wherever the one-pair
warm path would give up or take its slower branch: Newton not converged within the step
limit or its steps not shrinking, a non-finite value or slope, eps_PQ <= 0, truncated mass
>= delta, a tail sum below the linear-space floor (log-space sums needed), or eps_QP >
eps_PQ. Evaluating lanes together replaces one numpy call per lane and Newton step by one per
stack and Newton step (``docs/run_description.md``, "Per-step accounting").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import (
    _LINEAR_TAIL_FLOOR,
    _NEWTON_ACCEPT,
)

__all__ = []

_PQ_STEPS = 8  # Newton steps on log delta_PQ before a lane is left to the one-pair path
_INVERSE_STEPS = 12  # Newton steps on L(y) = -eps_PQ


@dataclass(frozen=True)
class StackSolution:
    """Per lane: ``epsilon`` (NaN where unsolved), ``solved``, and the thresholds y_PQ (the
    root of delta_PQ) and y_QP (the y with L(y) = -epsilon) to warm-start a later solve."""

    epsilon: np.ndarray
    solved: np.ndarray
    y_pq: np.ndarray
    y_qp: np.ndarray


class MixtureStack:
    """B pairs (module docstring). Inputs are trusted: ``log_weights`` of shape (B, K) with
    -inf outside each lane's support and at least one finite entry per row at a shift > 0,
    ``scales`` > 0 and ``dropped_mass`` >= 0 of shape (B,)."""

    __slots__ = ("_a", "_b", "_floor", "_lw_max", "_m", "_s", "_w_rel", "_x_over_s")

    def __init__(
        self, offset: int, log_weights: np.ndarray, scales: np.ndarray, dropped_mass: np.ndarray
    ) -> None:
        x = offset + np.arange(log_weights.shape[1], dtype=float)
        s = np.asarray(scales, dtype=float)[:, None]
        self._s = s[:, 0]
        self._m = np.asarray(dropped_mass, dtype=float)
        self._x_over_s = x / s
        self._a = self._x_over_s / s
        with np.errstate(invalid="ignore"):
            self._b = log_weights - 0.5 * self._x_over_s**2
        self._lw_max = log_weights.max(axis=1)
        self._w_rel = np.exp(log_weights - self._lw_max[:, None])
        # lim_{y -> -inf} L_b(y): the log weight at shift 0, -inf where there is none
        self._floor = log_weights[:, 0] if offset == 0 else np.full(self._s.size, -math.inf)

    @property
    def size(self) -> int:
        return int(self._s.size)

    def select(self, lanes: np.ndarray) -> MixtureStack:
        """The stack of the given lanes only."""
        out = MixtureStack.__new__(MixtureStack)
        for name in self.__slots__:
            setattr(out, name, getattr(self, name)[lanes])
        return out

    # -- the one-pair quantities, for the lanes ``i`` at points ``y`` -----------------------

    def _loss_and_slope(self, i: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = self._a[i]
        v = a * y[:, None] + self._b[i]
        top = v.max(axis=1)
        e = np.exp(v - top[:, None])
        total = e.sum(axis=1)
        return top + np.log(total), np.einsum("ij,ij->i", e, a) / total

    def _log_tail(self, i: np.ndarray, z: np.ndarray) -> np.ndarray:
        """log sum_k w_k Phi(z_k) per lane, in linear space; NaN where the sum is below the
        floor of :meth:`ShiftedGaussianMixture._log_tail` (that lane needs log space)."""
        total = np.einsum("ij,ij->i", self._w_rel[i], special.ndtr(z))
        with np.errstate(divide="ignore"):
            out = self._lw_max[i] + np.log(total)
        out[~(total >= _LINEAR_TAIL_FLOOR)] = math.nan
        return out

    def _log_delta_pq(
        self, i: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """log delta_PQ(y) and its derivative (NaN where the one-pair path would differ),
        and L(y), L'(y)."""
        s = self._s[i]
        loss, slope = self._loss_and_slope(i, y)
        log_p_upper = self._log_tail(i, self._x_over_s[i] - (y / s)[:, None])
        exponent = loss + special.log_ndtr(-y / s)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_delta = log_p_upper + np.log(-np.expm1(exponent - log_p_upper))
            log_delta[~(exponent < log_p_upper)] = math.nan  # delta vanishes: not this path
            slope_out = -slope * np.exp(np.minimum(exponent - log_delta, 700.0))
        return log_delta, slope_out, loss, slope

    # -- the solve ----------------------------------------------------------------------------

    def epsilons(self, delta: float, y_pq: np.ndarray, y_qp: np.ndarray) -> StackSolution:
        """epsilon(delta) of every lane from the warm starts ``y_pq``, ``y_qp`` (module
        docstring); lanes where the warm path does not apply are marked unsolved."""
        n = self.size
        eps = np.full(n, math.nan)
        out_pq = np.asarray(y_pq, dtype=float).copy()
        out_qp = np.asarray(y_qp, dtype=float).copy()
        target = delta - self._m
        ok = (target > 0) & np.isfinite(out_pq) & np.isfinite(out_qp)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_target = np.log(target)
        # Newton on log delta_PQ(y) = log(delta - m), every lane at once (as _newton)
        active = np.flatnonzero(ok)
        previous = np.full(n, math.inf)
        converged = np.zeros(n, dtype=bool)
        loss_at = np.full(n, math.nan)  # L at the accepted root, to first order (below)
        for _ in range(_PQ_STEPS):
            if active.size == 0:
                break
            y = out_pq[active]
            value, slope, loss, loss_slope = self._log_delta_pq(active, y)
            with np.errstate(invalid="ignore"):
                step = (value - log_target[active]) / slope
            good = np.isfinite(step) & np.isfinite(value) & (slope != 0.0)
            y = y - step
            out_pq[active] = y
            size = np.abs(step)
            done = good & (size <= _NEWTON_ACCEPT * (1.0 + np.abs(y)))
            failed = ~good | (~done & (size >= previous[active]))
            converged[active[done]] = True
            # eps_PQ = L(y_PQ) = L(y) - L'(y) step + O(step^2): the last step is <= 1e-9
            # (1 + |y|) and L'' is of order 1/s^2, so the neglected term is below 1e-17
            loss_at[active[done]] = (loss + loss_slope * (-step))[done]
            ok[active[failed]] = False
            previous[active] = size
            active = active[~done & ~failed]
        ok &= converged
        lanes = np.flatnonzero(ok)
        if lanes.size == 0:
            return StackSolution(eps, ok, out_pq, out_qp)
        eps_pq = loss_at[lanes]
        ok[lanes[~(eps_pq > 0.0)]] = False
        # L(y) >= its floor > -eps_PQ everywhere: no output favours Q by e^eps_PQ, so
        # delta_QP(eps_PQ) = 0 and eps = eps_PQ (the one-pair path finds eps_QP <= eps_PQ)
        alone = (eps_pq > 0.0) & ~(-eps_pq > self._floor[lanes])
        eps[lanes[alone]] = eps_pq[alone]
        keep = (eps_pq > 0.0) & ~alone
        lanes, eps_pq = lanes[keep], eps_pq[keep]
        if lanes.size == 0:
            return StackSolution(eps, ok, out_pq, out_qp)
        # y_QP: L(y) = -eps_PQ by Newton from the hint (as _loss_inverse from a warm start)
        y = out_qp[lanes]
        active = np.arange(lanes.size)
        previous = np.full(lanes.size, math.inf)
        for _ in range(_INVERSE_STEPS):
            if active.size == 0:
                break
            loss, slope = self._loss_and_slope(lanes[active], y[active])
            bad = ~((slope > 0.0) & np.isfinite(loss))  # the one-pair path restarts cold
            step = (loss + eps_pq[active]) / np.where(bad, 1.0, slope)
            y[active] -= np.where(bad, 0.0, step)
            size = np.abs(step)
            stop = (size <= _NEWTON_ACCEPT * (1.0 + np.abs(y[active]))) | (
                (size >= previous[active]) & (previous[active] > 0)
            )
            ok[lanes[active[bad]]] = False
            previous[active] = size
            active = active[~stop & ~bad]
        ok[lanes[active]] = False  # not converged in the step limit
        out_qp[lanes] = y
        # delta_QP at eps_PQ (as _log_delta_qp_at): <= delta means eps_QP <= eps_PQ
        s = self._s[lanes]
        log_q_lower = special.log_ndtr(y / s)
        log_p_lower = self._log_tail(lanes, (y / s)[:, None] - self._x_over_s[lanes])
        b = log_p_lower + eps_pq
        with np.errstate(invalid="ignore", divide="ignore"):
            log_delta_qp = np.where(
                b < log_q_lower, log_q_lower + np.log(-np.expm1(b - log_q_lower)), -math.inf
            )
        below = (log_delta_qp <= math.log(delta)) & ~np.isnan(log_p_lower)
        ok[lanes[~below]] = False
        solved = lanes[below & ok[lanes]]
        eps[solved] = eps_pq[below & ok[lanes]]
        return StackSolution(eps, ok, out_pq, out_qp)
