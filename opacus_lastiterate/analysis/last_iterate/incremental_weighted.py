"""Per-step accounting of the weighted heuristic (learning-rate schedules, momentum).

The weighted pair after T steps (:mod:`.weighted_heuristic`) is

    P_T = sum_t w_t(T) Bernoulli(q_t) + N(0, s_T^2),   Q_T = N(0, s_T^2),
    s_T^2 = sum_t w_t(T)^2 sigma_t^2,

where w_t(T) is the weight of step t's noisy gradient in the model after T steps. Solving it
from scratch costs one convolution per step, T per query. :class:`IncrementalWeightedHeuristic`
keeps most of that work between steps.

Epsilon queries go first to the grid-free route (exact weights, characteristic-function
inversion with a certified error; ``docs/last_iterate.md``, "Weighted heuristic without a
grid"), its characteristic function kept up to date between queries by
:class:`~.incremental_fourier.IncrementalCharacteristic` (old steps frozen with a certified
remainder; no O(T) work per query, nothing per step); :mod:`.weighted_fourier` from scratch
answers whenever the kept one declines. While the route answers, no grid state is kept. It answers however often it is asked (every step, every k steps, after a
long gap): there is no switch of route, hence no switch stall. The first time it declines (a
bracket wider than ``accuracy``, typically epsilon above about 14 at delta = 1e-5, 8 at
1e-8) the engine switches to the grid below for good, so that the grid state is built once.
Delta queries use the grid.

Scope
-----
The incremental path covers ``torch.optim.SGD`` without weight decay, with one momentum
beta in [0, 1), one dampening d and one nesterov flag for the whole run (any learning rates,
sample rates and noise multipliers > 0 per step). Then, with R_t(T) = sum_{s=t..T} eta_s
beta^(s-t), a_1 = 1 and a_t = 1 - d for t > 1 (a_t = 1 when beta = 0),

    heavy ball:  w_t(T) = a_t R_t(T),        nesterov:  w_t(T) = eta_t + beta a_t R_t(T).

Other traces (weight decay, varying momentum or dampening, beta = 1, a step without noise)
are answered by the from-scratch solve (:func:`~.weighted_heuristic.solve_trusted`).

Soundness
---------
1. *Weights only grow, by a bounded amount.* All terms of R_t(T) are >= 0, so w_t(T) is
   non-decreasing in T, and R_t(T') - R_t(T) = beta^(T+1-t) sum_{s=T+1..T'} eta_s
   beta^(s-T-1). If every later rate is <= eta_bar, this is <= beta^(T+1-t) eta_bar /
   (1 - beta); with a_t <= 1 (and the extra factor beta <= 1 for nesterov)

       w_t(T) <= w_t(T') <= w_t(T) + G_t(T),   G_t(T) = beta^(T+1-t) eta_bar / (1 - beta).

   eta_bar is ``RATE_SAFETY`` x the largest rate seen; a later rate above it triggers a
   rebuild of the state below (with a new eta_bar) before the next answer.
2. *Monotone rounding.* Rounding shifts up (noise fixed) gives a pair that is at least as
   easy to distinguish in both directions, rounding down one that is at most as easy
   (stochastic order; see :mod:`.weighted_heuristic`). Moving any mass of the shift law up
   is "rounding up", moving it down (to shift 0, say) is "rounding down". A smaller noise
   scale is equivalent to larger shifts at a fixed scale (divide everything by s), so the
   upper pair may use any s' <= s_T and the lower pair any s' >= s_T.
3. *Freezing.* A step t of age T - t >= H is frozen once, at T_f: its upper unit count is
   ceil((w_t(T_f) + G_t(T_f)) / h) and its lower count floor(w_t(T_f) / h) on a fine grid of
   fixed spacing h. By 1 these bracket w_t(T) / h at every later T (until a rebuild). The
   frozen counts are folded, once, into two pmfs on the fine grid by the non-negative two-point
   step p <- (1 - q) p + q shift_k(p) (linear space, no FFT: tail masses keep their relative
   precision). H is the smallest age with G <= ``FREEZE_SLACK`` x h, so freezing adds a
   fraction of a grid unit. The noise of frozen steps is bracketed by sigma_t^2 w_t(T_f)^2
   (for the upper pair) and sigma_t^2 (w_t(T_f) + G_t(T_f))^2 (for the lower pair).
4. *Active steps and the coarse grid.* At a query the frozen pmfs are moved to a grid of
   spacing c = h 2^e: for e >= 0 every fine point is rounded up (upper pmf) or down (lower
   pmf) to a coarse point, a one-time shift of less than c; for e < 0 the fine grid embeds
   exactly. The active steps (age < H) enter with their current weights w_t(T) rounded up /
   down to the coarse grid, and the pairs are evaluated there with the exact engine
   (:class:`~.gaussian_mixture.ShiftedGaussianMixture`, warm-started from the last query).
5. *Truncation.* Cutting the tails of a pmf: in the upper pmf the lower tail is moved up into
   the first kept point and the upper tail is dropped and added to delta (H(P, Q) <=
   H(P_kept, Q) + m, H(Q, P) <= H(Q, P_kept)); in the lower pmf both tails are moved to
   shift 0. Both bounds thus stay certified whatever the budgets.

So the returned value is an upper bound and ``lower_bound`` a lower bound on the exact
weighted heuristic at the current T (up to the engine's root tolerance and, on the noise,
a relative 1e-9 margin for floating-point sums). The coarse exponent e adapts to the measured
gap: it drops (and the query is redone) while (upper - lower) / upper > accuracy and rises
when the gap is below accuracy / 2.5. If even e = ``_MIN_EXPONENT`` misses the accuracy the
query is answered from scratch and the fine grid is halved at the next query (a rebuild).

Cost per step: folding a newly frozen step is O(L_f) (fine pmf length, about N_f (sum_t
u_t q_t + a few standard deviations), N_f = ``FINE_POINTS`` / accuracy points per largest
weight); frozen steps are folded in blocks, so most steps only convolve the H active steps
on the coarse grid (H about 100 for beta = 0.9) and solve two warm-started roots.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.last_iterate.grid_pmf import GridPmf
from opacus_lastiterate.analysis.last_iterate.incremental_fourier import IncrementalCharacteristic
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    HeavyBallRecursion,
    sgd_weights,
)
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import fourier_solve
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    WeightedHeuristicResult,
    solve_trusted,
)

__all__ = [
    "FINE_POINTS",
    "SPARSE_FINE_POINTS",
    "IncrementalWeightedHeuristic",
]

RATE_SAFETY = 2.0  # eta_bar = RATE_SAFETY x the largest learning rate seen
FREEZE_SLACK = 0.1  # freeze once the future growth bound G is <= FREEZE_SLACK x h
SEMI_SLACK = 0.5  # semi-freeze on the coarse grid once G <= SEMI_SLACK x c
FINE_POINTS = 8.0  # fine grid points per largest weight = FINE_POINTS / accuracy
SPARSE_FINE_POINTS = 4.0
"""``fine_points`` for an engine queried every 50 steps or more (a monitor's cadence): half
the fold work per step for a finer coarse grid at each query. Measured (momentum 0.9, cosine,
q = 0.045, accuracy 1e-3, one BLAS thread): queried every 100 steps, 0.26 s instead of 0.43 s
for 500 steps and 9.3 s instead of 14.7 s for 5000; every 50 steps, 3.2 s instead of 4.1 s for
2000; but every 10 steps 3.4 s instead of 3.1 s, and every step 24 s instead of 15 s for 1000
(``FINE_POINTS`` is the better choice there)."""
_FOLD_BUDGET = 1e-32  # mass cut per end and trim of the fine pmfs
_TRIM_EVERY = 8  # folds between trims
_BLOCK_WORK = 3_000_000  # frozen steps are folded in blocks of about this many grid updates
_MAX_BLOCK = 32
_MIN_EXPONENT = -12
_MAX_FINE = 32.0  # at most _MAX_FINE / accuracy fine points per largest weight
_RAISE = 2.5  # coarsen when the gap is below accuracy / _RAISE
_MAX_EXPONENT = 20
_MAX_POINTS = 4_000_000  # a query grid finer than this answers from scratch (bounded memory)
_ROUND = 1e-12  # relative margin so that float rounding of w / h never crosses a grid point
_NOISE = 1e-9  # relative margin on the noise variance sums
Hints = tuple[float, float, float]


@dataclass
class _State:
    """Frozen fine pmfs and the active window, built for a fixed (h, eta_bar, H)."""

    h: float
    eta_bar: float
    horizon: int
    block: int
    up: GridPmf
    low: GridPmf
    var_lo: float = 0.0
    var_hi: float = 0.0
    frozen: int = 0  # steps 0..frozen-1 are frozen
    version: int = 0  # bumped when the frozen pmfs change
    coarse: dict[int, tuple[GridPmf, GridPmf, int]] = field(default_factory=dict)


class IncrementalWeightedHeuristic:
    """The weighted heuristic of a growing SGD run, updated step by step (module docstring).

    Inputs to :meth:`append` are trusted (the accountant validates them).

    Args:
        accuracy: requested bound on (upper - lower) / upper, in (0, 1).
        fine_points: fine grid points per largest weight, times ``accuracy``
            (:data:`FINE_POINTS` suits a query after every step, :data:`SPARSE_FINE_POINTS`
            one every 50 steps or more). Any value gives certified brackets; it trades the
            work per step against the work per query.
        fourier: answer epsilon queries by characteristic-function inversion
            (:mod:`.weighted_fourier`, no grid, no per-step work) until it first declines;
            ``False`` keeps to the grid.
    """

    def __init__(
        self, accuracy: float = 1e-3, fine_points: float = FINE_POINTS, fourier: bool = True
    ) -> None:
        self.accuracy = float(accuracy)
        self.fine_points = float(fine_points)
        self._eta: list[float] = []
        self._sigma: list[float] = []
        self._q: list[float] = []
        self._opt: list[tuple[float, float, bool, float]] = []  # (beta, d, nesterov, lambda)
        self._settings: tuple[float, float, bool] | None = None  # (beta, dampening, nesterov)
        self._supported = True
        self._max_eta = 0.0
        self._fine_points = self.fine_points / self.accuracy
        self._state: _State | None = None
        self._fourier = bool(fourier)  # epsilon by weighted_fourier until it first declines
        # the characteristic function kept step by step (after a first answer from scratch)
        self._characteristic: IncrementalCharacteristic | None = None
        # active window (steps frozen..T-1): R_t(T)
        self._r = np.zeros(0)
        self._exponent = 0
        self._hints: dict[tuple[str, float], tuple[Hints | None, Hints | None]] = {}
        self._cache: dict[tuple[str, float], tuple[int, WeightedHeuristicResult]] = {}
        self.rebuilds = 0
        self.fallbacks = 0

    # -- the run ----------------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        return len(self._eta)

    @property
    def supported(self) -> bool:
        """Whether the incremental path applies (module docstring, "Scope")."""
        return self._supported

    def append(
        self,
        noise_multiplier: float,
        sample_rate: float,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        """Record one step: (sigma, q) and the SGD settings it used (torch semantics)."""
        beta = float(momentum)
        settings = (beta, float(dampening) if beta > 0 else 0.0, bool(nesterov) and beta > 0)
        if self._settings is None:
            self._settings = settings
        if (
            weight_decay != 0.0
            or settings != self._settings
            or not beta < 1.0
            or not noise_multiplier > 0.0
        ):
            self._supported, self._state = False, None
        self._eta.append(float(lr))
        self._sigma.append(float(noise_multiplier))
        self._q.append(float(sample_rate))
        self._opt.append((beta, float(dampening), bool(nesterov), float(weight_decay)))
        if not self._supported:
            return
        state = self._state
        if lr > self._max_eta:
            self._max_eta = float(lr)
        if state is None:
            return
        if lr > state.eta_bar:  # the growth bound no longer holds: rebuild at the next query
            self._state = None
            return
        beta_, _, _ = self._settings
        t_now = self.num_steps - 1  # index of the new step
        if self._r.size:
            ages = t_now - np.arange(state.frozen, t_now)
            self._r = self._r + float(lr) * np.power(beta_, ages)
        self._r = np.r_[self._r, float(lr)]
        if self._r.size >= state.horizon + state.block:
            self._freeze(state, self._r.size - state.horizon)

    def extend(
        self,
        noise_multipliers: np.ndarray,
        sample_rates: np.ndarray,
        lrs: np.ndarray,
        momentum: np.ndarray,
        dampening: np.ndarray,
        nesterov: np.ndarray,
        weight_decay: np.ndarray,
    ) -> None:
        """:meth:`append` for each step of these per-step arrays, in order (the same state,
        without a Python call per step while no grid is kept)."""
        if self._state is not None or self._settings is None or not len(lrs):
            for s_, q_, l_, m_, d_, n_, w_ in zip(noise_multipliers, sample_rates, lrs, momentum,
                                                  dampening, nesterov, weight_decay, strict=True):
                self.append(float(s_), float(q_), float(l_), float(m_), float(d_), bool(n_),
                            float(w_))  # fmt: skip
            return
        beta = np.asarray(momentum, dtype=float)
        damp = np.asarray(dampening, dtype=float)
        nest = np.asarray(nesterov, dtype=bool)
        wd = np.asarray(weight_decay, dtype=float)
        sigma = np.asarray(noise_multipliers, dtype=float)
        lr = np.asarray(lrs, dtype=float)
        b0, d0, n0 = self._settings
        same = (
            np.all(beta == b0)
            and np.all(np.where(beta > 0, damp, 0.0) == d0)
            and np.all((nest & (beta > 0)) == n0)
        )
        if not (same and np.all(wd == 0.0) and b0 < 1.0 and np.all(sigma > 0.0)):
            self._supported, self._state = False, None
        self._eta.extend(lr.tolist())
        self._sigma.extend(sigma.tolist())
        self._q.extend(np.asarray(sample_rates, dtype=float).tolist())
        self._opt.extend(zip(beta.tolist(), damp.tolist(), nest.tolist(), wd.tolist(), strict=True))
        if self._supported:
            self._max_eta = max(self._max_eta, float(lr.max()))

    # -- a checkpoint ---------------------------------------------------------------------------

    def characteristic_state(self) -> dict[str, Any] | None:
        """The kept characteristic function as plain lists and floats (None when there is
        none: before the first epsilon query, or once the grid answers), so that a restored
        engine answers its next query without rebuilding it (O(T M))."""
        char = self._characteristic
        if char is None or not self._fourier or not self._supported:
            return None
        return char.state(self._eta, self._sigma, self._q)

    def restore_characteristic(self, state: Mapping[str, Any]) -> bool:
        """Take up a :meth:`characteristic_state` saved for this run (the same steps, up to
        the steps appended since); False (nothing changed) if it is not for this run."""
        if not (self._supported and self._fourier) or self._settings is None:
            return False
        char = IncrementalCharacteristic.from_state(
            state, self._eta, self._sigma, self._q, self._settings
        )
        if char is None:
            return False
        self._characteristic = char
        return True

    # -- weights ------------------------------------------------------------------------------

    def _weights(self, first: int, r: np.ndarray) -> np.ndarray:
        """w_t(T) for t = first..first + len(r) - 1 from R_t(T)."""
        assert self._settings is not None
        rec = HeavyBallRecursion(*self._settings)
        eta = np.asarray(self._eta[first : first + r.size]) if rec.nesterov else r
        return rec.weights(first, r, eta)

    def _discounted_rates(self) -> np.ndarray:
        """R_t(T) = sum_{s=t..T} eta_s beta^(s-t) for every step (one backward filter)."""
        assert self._settings is not None
        return HeavyBallRecursion(*self._settings).discounted_rates(np.asarray(self._eta))

    def _weight_scale(self) -> float:
        """About the largest weight a step can reach at rates <= the largest seen."""
        assert self._settings is not None
        beta, d, nesterov = self._settings
        if nesterov:
            return self._max_eta / (1.0 - beta)
        return self._max_eta * max(1.0, (1.0 - d) / (1.0 - beta))

    # -- building and freezing -----------------------------------------------------------------

    def _build(self) -> _State:
        assert self._settings is not None
        beta = self._settings[0]
        self.rebuilds += 1
        eta_bar = RATE_SAFETY * self._max_eta
        h = self._weight_scale() / self._fine_points
        growth = eta_bar / (1.0 - beta)
        horizon = 0
        if beta > 0.0:
            # smallest H with beta^(H+1) eta_bar / (1 - beta) <= FREEZE_SLACK h
            horizon = max(0, math.ceil(math.log(FREEZE_SLACK * h / growth) / math.log(beta)) - 1)
        state = _State(h, eta_bar, horizon, 1, GridPmf(np.ones(1)), GridPmf(np.ones(1), upper=False))
        eta = np.asarray(self._eta)
        self._r = self._discounted_rates()
        self._exponent = min(self._exponent, 0)
        self._freeze(state, max(0, eta.size - horizon))
        self._hints.clear()
        return state

    def _freeze(self, state: _State, count: int) -> None:
        """Freeze the ``count`` oldest active steps (module docstring, item 3)."""
        if count <= 0:
            return
        assert self._settings is not None
        beta = self._settings[0]
        first, t_now = state.frozen, self.num_steps - 1
        r, self._r = self._r[:count], self._r[count:]
        w = self._weights(first, r)
        idx = np.arange(first, first + count)
        growth = np.power(beta, t_now + 1 - idx) * state.eta_bar / (1.0 - beta)
        k_up = np.ceil((w + growth) / state.h * (1.0 + _ROUND)).astype(np.int64)
        k_lo = np.floor(w / state.h * (1.0 - _ROUND)).astype(np.int64)
        sig2 = np.asarray(self._sigma[first : first + count]) ** 2
        q = self._q[first : first + count]
        state.var_lo += float(np.dot(sig2, w * w))
        state.var_hi += float(np.dot(sig2, (w + growth) ** 2))
        for i in range(count):
            state.up.fold(int(k_up[i]), q[i])
            state.low.fold(int(k_lo[i]), q[i])
            if i % _TRIM_EVERY == _TRIM_EVERY - 1 or i == count - 1:
                state.up.trim(_FOLD_BUDGET)
                state.low.trim(_FOLD_BUDGET)
        state.frozen += count
        state.version += 1
        state.coarse.clear()
        state.block = int(min(_MAX_BLOCK, max(3, _BLOCK_WORK // max(state.up.p.size, 1))))

    # -- queries ------------------------------------------------------------------------------

    def _coarse(self, state: _State, e: int, w: np.ndarray, q: list[float]) -> tuple[GridPmf, GridPmf, int]:
        """The frozen pmfs on the grid c = h 2^e with the semi-frozen steps folded in
        (module docstring, item 4); returns them and the number of semi-frozen steps."""
        assert self._settings is not None
        beta = self._settings[0]
        c = state.h * 2.0**e
        got = state.coarse.get(e)
        if got is None:
            if e >= 0:
                got = (state.up.rebin(1 << e), state.low.rebin(1 << e), 0)
            else:
                got = (state.up.refine(1 << -e), state.low.refine(1 << -e), 0)
        up, low, done = got
        # semi-frozen: ages >= the smallest a with beta^(a+1) eta_bar / (1 - beta) <= slack c
        horizon = state.horizon
        if beta > 0.0:
            ratio = SEMI_SLACK * c * (1.0 - beta) / state.eta_bar
            horizon = min(horizon, max(0, math.ceil(math.log(ratio) / math.log(beta)) - 1))
        semi = max(0, w.size - horizon)
        if semi > done:
            t_now = self.num_steps - 1
            idx = np.arange(state.frozen + done, state.frozen + semi)
            growth = np.power(beta, t_now + 1 - idx) * state.eta_bar / (1.0 - beta)
            ws = w[done:semi]
            k_up = np.ceil((ws + growth) / c * (1.0 + _ROUND)).astype(np.int64)
            k_lo = np.floor(ws / c * (1.0 - _ROUND)).astype(np.int64)
            for i in range(semi - done):
                up.fold(int(k_up[i]), q[done + i])
                low.fold(int(k_lo[i]), q[done + i])
            up.trim(_FOLD_BUDGET)
            low.trim(_FOLD_BUDGET)
            done = semi
        state.coarse = {e: (up, low, done)}
        return up, low, done

    def _evaluate(
        self, state: _State, e: int, quantity: str, argument: float
    ) -> tuple[float, float, GridPmf, Hints | None, Hints | None]:
        c = state.h * 2.0**e
        w = self._weights(state.frozen, self._r)
        q = self._q[state.frozen :]
        up, low, semi = self._coarse(state, e, w, q)
        up, low = up.copy(), low.copy()
        budget = max(1e-30, 1e-4 * self.accuracy * argument) if quantity == "epsilon" else 1e-30
        budget /= 2 * ((w.size - semi) // _TRIM_EVERY + 3)
        up.trim(budget)  # cut the frozen law to the query's budget before the active folds
        low.trim(budget)
        k_up = np.ceil(w[semi:] / c * (1.0 + _ROUND)).astype(np.int64)
        k_lo = np.floor(w[semi:] / c * (1.0 - _ROUND)).astype(np.int64)
        for i in range(k_up.size):
            up.fold(int(k_up[i]), q[semi + i])
            low.fold(int(k_lo[i]), q[semi + i])
            if i % _TRIM_EVERY == _TRIM_EVERY - 1:
                up.trim(budget)
                low.trim(budget)
        up.trim(budget)
        low.trim(budget)
        sig2 = np.asarray(self._sigma[state.frozen :]) ** 2
        active = float(np.dot(sig2, w * w))
        s_up = math.sqrt((state.var_lo + active) * (1.0 - _NOISE))
        s_low = math.sqrt((state.var_hi + active) * (1.0 + _NOISE))
        hints = self._hints.get((quantity, argument), (None, None))
        values: list[float] = []
        new_hints: list[Hints | None] = []
        for pmf, scale, hint in ((up, s_up, hints[0]), (low, s_low, hints[1])):
            pair = pmf.pair(c, scale)
            if pair is None:
                values.append(0.0)
                new_hints.append(None)
            elif quantity == "epsilon":
                eps, hh = pair.epsilon_warm(argument, hint)
                values.append(eps)
                new_hints.append(hh if all(math.isfinite(x) for x in hh) else None)
            else:
                values.append(pair.delta(argument))
                new_hints.append(None)
        return values[0], values[1], up, new_hints[0], new_hints[1]

    def _solve(self, quantity: str, argument: float) -> WeightedHeuristicResult:
        acc = self.accuracy
        n = self.num_steps

        def result(value, lower, rel, resolution, size, dropped) -> WeightedHeuristicResult:
            return WeightedHeuristicResult(
                float(value), float(lower), float(rel), acc, False, int(resolution),
                int(size), float(dropped), n, quantity, argument,
            )  # fmt: skip

        if n == 0:
            return result(0.0, 0.0, 0.0, 0, 1, 0.0)
        if not self._supported:
            return self._scratch(quantity, argument)
        if self._fourier and quantity == "epsilon":
            # the same route however often it is asked: no switch (and no stall) while it
            # answers; the grid from its first decline on
            got = self._fourier_solve(argument)
            if got is not None:
                self._state = None  # no grid to keep up to date while this route answers
                return got
            self._fourier = False
            self._characteristic = None
        state = self._state
        if state is None:
            state = self._state = self._build()
        e = self._exponent
        while True:
            upper, lower, up, h_up, h_low = self._evaluate(state, e, quantity, argument)
            if upper > 0 and math.isfinite(upper):
                rel = max(0.0, (upper - lower) / upper)
            else:
                rel = 0.0 if upper == 0 else math.inf
            if rel <= acc:
                break
            finer = state.up.p.size * 2.0 ** max(0, -(e - 1))
            if e <= _MIN_EXPONENT or not math.isfinite(rel) or finer > _MAX_POINTS:
                self.fallbacks += 1
                if self._fine_points < _MAX_FINE / acc:  # refine the fine grid (bounded)
                    self._fine_points *= 2.0
                    self._state = None
                return self._scratch(quantity, argument)
            e -= 1
        self._hints[(quantity, argument)] = (h_up, h_low)
        if rel < acc / _RAISE and e < _MAX_EXPONENT:
            e += 1
        self._exponent = e
        size = int(np.count_nonzero(up.p))
        return result(upper, lower, rel, round(self._fine_points), size, up.dropped)

    def _fourier_solve(self, delta: float) -> WeightedHeuristicResult | None:
        """Exact weights through the characteristic function, kept up to date step by step
        (:mod:`.incremental_fourier`); from scratch (:mod:`.weighted_fourier`) whenever the
        kept one declines."""
        char = self._characteristic
        if char is None:
            assert self._settings is not None
            char = self._characteristic = IncrementalCharacteristic(*self._settings)
        got = char.solve(delta, self._eta, self._sigma, self._q, self.accuracy)
        if got is not None:
            upper, lower, terms = got
            rel = (upper - lower) / upper if upper > 0 else 0.0
            return WeightedHeuristicResult(
                upper, lower, rel, self.accuracy, False, 0, terms, 0.0, self.num_steps,
                "epsilon", delta,
            )  # fmt: skip
        w = self._weights(0, self._discounted_rates())
        keep = w > 0
        return fourier_solve(
            delta, w[keep], np.asarray(self._q)[keep], np.asarray(self._sigma)[keep],
            self.accuracy,
        )

    def _scratch(self, quantity: str, argument: float) -> WeightedHeuristicResult:
        """The from-scratch solve of the whole run (traces outside the incremental scope)."""
        m, d, nest, wd = (np.asarray(v) for v in zip(*self._opt, strict=True))
        w = sgd_weights(
            np.asarray(self._eta), momentum=m, dampening=d, nesterov=bool(np.any(nest)),
            weight_decay=wd,
        )  # fmt: skip
        q, sigma = np.asarray(self._q), np.asarray(self._sigma)
        keep = w > 0
        return solve_trusted(quantity, argument, w[keep], q[keep], sigma[keep], self.accuracy)

    def epsilon(self, delta: float) -> WeightedHeuristicResult:
        """Upper bound on the weighted heuristic epsilon at (validated) ``delta``, with a
        certified lower bound within ``accuracy`` relative; cached per step."""
        return self._query("epsilon", delta)

    def delta(self, epsilon: float) -> WeightedHeuristicResult:
        """Upper bound on the weighted heuristic delta(epsilon), bracketed like :meth:`epsilon`."""
        return self._query("delta", epsilon)

    def _query(self, quantity: str, argument: float) -> WeightedHeuristicResult:
        key = (quantity, argument)
        got = self._cache.get(key)
        if got is not None and got[0] == self.num_steps:
            return got[1]
        res = self._solve(quantity, argument)
        self._cache[key] = (self.num_steps, res)
        return res
