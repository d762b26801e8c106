"""The next frequency grid of the kept characteristic function, built ahead a block of frozen
steps per query: the *shadow* of :mod:`.incremental_fourier` ("The frequency grid and the
scan"), so that no query pays for a whole grid (O(T M)) at once.

Started at step n0 with R_t(n0) of every step before it (one backward filter), it folds the
frozen steps t < n0 at their current weights,

    R_t(T) = R_t(n0) + beta^(n0 - t) R_{n0}(T),

R_{n0}(T) kept step by step (:meth:`ShadowGrid.advance`); steps frozen after n0 are folded as
they freeze, with the weights and growth coefficients the current grid gets
(:meth:`ShadowGrid.fold_frozen`). Rounding of the refolded weights is charged like that of a
rebuilt grid: the backward filter's (at most about 2 / (1 - beta) + 2 updates), the updates
of R_{n0}(T), a_t and the sum.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.last_iterate.characteristic_grid import FrequencyGrid
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import HeavyBallRecursion
from opacus_lastiterate.analysis.last_iterate.step_factors import PHASOR_CHARGE, g_q
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import FP_CHARGE

__all__ = []

_BLOCK = 16  # frozen steps folded per query, at least


class ShadowGrid:
    """The next grid (module docstring): the steps 0..``cursor``-1 folded so far.

    Args:
        grid: an empty grid for the run at step n0.
        eta0: the rates of the steps before n0.
        recursion: the run's momentum, dampening and nesterov flag.
        syncs: the characteristic function's updates so far (rounding of R_{n0}(T)).
        used: the share of a margin the current grid had used at n0.
    """

    def __init__(
        self, grid: FrequencyGrid, eta0: np.ndarray, recursion: HeavyBallRecursion, syncs: int,
        used: float,
    ) -> None:
        self.grid, self.recursion = grid, recursion
        self.n0 = int(eta0.size)
        self.r0 = recursion.discounted_rates(eta0)  # R_t(n0), t < n0
        self.syncs0, self.used0 = syncs, used
        self.rho0 = 0.0  # R_{n0}(T)
        self.cursor = 0
        self.last_n = self.n0  # steps at the last query

    def advance(self, rho: float, decay: float, steps_before: int) -> None:
        """Take in the steps after ``steps_before`` whose R_{T+1}(T') is ``rho`` (``decay`` =
        beta^(T' - T)): R_{n0}(T') = R_{n0}(T) + beta^(T - n0) R_{T+1}(T')."""
        self.grid.advance(rho, decay)
        self.rho0 += self.recursion.beta ** (steps_before - self.n0) * rho

    def fold_frozen(self, first: int, w: np.ndarray, q: np.ndarray, c: np.ndarray) -> None:
        """The steps first..first+len(w)-1 frozen now, with their weights and growth
        coefficients: those from n0 on are folded (the cursor covers the others)."""
        k = first + w.size - max(first, self.n0)
        if k > 0:
            self.grid.fold(w[-k:], q[-k:], c[-k:])

    def fold_share(
        self, frozen: int, steps: int, syncs: int, used: float, switch: float,
        eta: list[float], q: list[float],
    ) -> bool:
        """Fold the next block of frozen steps before n0, sized so that all of them are
        folded when the current grid is predicted to have used ``switch`` of a margin (its
        use so far ``used``); True when all are folded and ``used`` >= ``switch``."""
        end = min(frozen, self.n0)
        if self.cursor < end:
            rate = (used - self.used0) / max(1, steps - self.n0)
            left = (switch - used) / rate if rate > 0 else math.inf  # steps to the switch
            share = (steps - self.last_n) / max(1.0, left)
            count = max(_BLOCK, math.ceil(share * (end - self.cursor)))
            self.fold_until(min(end, self.cursor + count), steps, syncs, eta, q)
        self.last_n = steps
        return self.cursor >= end and used >= switch

    def fold_until(
        self, stop: int, steps: int, syncs: int, eta: list[float], q: list[float]
    ) -> None:
        """Fold the frozen steps cursor..stop-1 (< n0) at their weights after ``steps``."""
        lo, rec = self.cursor, self.recursion
        if stop <= lo:
            return
        t = np.arange(lo, stop, dtype=float)
        r = self.r0[lo:stop] + self.rho0 * rec.beta ** (self.n0 - t)
        w = rec.weights(lo, r, np.asarray(eta[lo:stop], dtype=float))
        qq = np.asarray(q[lo:stop], dtype=float)
        self.grid.fold(w, qq, rec.growth(lo, stop - lo, steps))
        if rec.beta > 0.0:
            age = np.minimum(self.n0 - t, 2.0 / (1.0 - rec.beta) + 2.0)
        else:
            age = np.zeros(t.size)
        age = age + (syncs - self.syncs0) + 6.0 + PHASOR_CHARGE
        self.grid.w_round += float(np.dot(g_q(qq), FP_CHARGE * age * w))
        self.cursor = stop

    # -- a checkpoint ---------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """Plain lists and floats; ``r0`` is recomputed from the run's rates."""
        return {"grid": self.grid.as_dict(), "n0": self.n0, "syncs0": self.syncs0,
                "used0": self.used0, "rho0": self.rho0, "cursor": self.cursor,
                "last_n": self.last_n}  # fmt: skip

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], eta: list[float], recursion: HeavyBallRecursion
    ) -> ShadowGrid:
        """The shadow of :meth:`as_dict` for the run of rates ``eta``.

        Raises:
            KeyError, TypeError, ValueError, IndexError: if ``d`` is not such a dict.
        """
        n0, cursor = int(d["n0"]), int(d["cursor"])
        if not (0 < n0 <= len(eta) and 0 <= cursor <= n0):
            raise ValueError("the shadow's steps are not in the run")
        sh = cls(FrequencyGrid.from_dict(d["grid"]), np.asarray(eta[:n0], dtype=float),
                 recursion, int(d["syncs0"]), float(d["used0"]))  # fmt: skip
        sh.rho0, sh.cursor, sh.last_n = float(d["rho0"]), cursor, int(d["last_n"])
        return sh
