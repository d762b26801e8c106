"""Per-step accounting of the weighted heuristic (learning-rate schedules, momentum).

The weighted pair after T steps (:mod:`.weighted_heuristic`) is

    P_T = sum_t w_t(T) Bernoulli(q_t) + N(0, s_T^2),   Q_T = N(0, s_T^2),
    s_T^2 = sum_t w_t(T)^2 sigma_t^2,

where w_t(T) is the weight of step t's noisy gradient in the model after T steps.
:class:`IncrementalWeightedHeuristic` follows a growing run and answers epsilon queries by one
of two routes (``docs/last_iterate.md``, "Weighted heuristic without a grid"):

1. the characteristic function kept step by step
   (:class:`~.incremental_fourier.IncrementalCharacteristic`: old steps frozen with a certified
   remainder; nothing per step, no O(T) work per query). Where the kept one declines a query (a
   delta its frequency grid does not fit, a worn grid), a new one built for the query answers
   it from scratch (O(T M));
2. the weight grid from scratch (:func:`~.weighted_heuristic.solve_trusted`) where both decline:
   a sample rate within ``Q_NEAR_HALF`` of 1/2, or an epsilon so large that the rounding charge
   times e^eps exceeds the accuracy (about 14 at delta = 1e-5, 8 at 1e-8, under momentum and a
   cosine schedule), and outside the first route's scope.

Each query is routed afresh: a decline at one delta or one step does not move later queries off
the kept route.

The run is kept as three float64 columns (rate, noise multiplier, sample rate: 24 bytes a step,
grown by doubling) and the SGD settings as runs of equal settings, not as Python objects per
step.

Scope of the Fourier routes: ``torch.optim.SGD`` without weight decay, with one momentum beta
in [0, 1), one dampening d and one nesterov flag for the whole run (any learning rates, sample
rates and noise multipliers > 0 per step). Then, with R_t(T) = sum_{s=t..T} eta_s beta^(s-t),
a_1 = 1 and a_t = 1 - d for t > 1 (a_t = 1 when beta = 0),

    heavy ball:  w_t(T) = a_t R_t(T),        nesterov:  w_t(T) = eta_t + beta a_t R_t(T).

Other traces (weight decay, varying momentum or dampening, beta = 1, a step without noise) are
answered by the weight grid from scratch. Both routes return an upper bound with a certified
lower bound within ``accuracy`` relative.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.last_iterate.incremental_fourier import IncrementalCharacteristic
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    WeightedHeuristicResult,
    solve_trusted,
)

__all__ = ["IncrementalWeightedHeuristic"]


class IncrementalWeightedHeuristic:
    """The weighted heuristic epsilon of a growing SGD run (module docstring).

    Inputs to :meth:`append` and :meth:`extend` are trusted (the accountant validates them).

    Args:
        accuracy: requested bound on (upper - lower) / upper, in (0, 1).
    """

    def __init__(self, accuracy: float = 1e-3) -> None:
        self.accuracy = float(accuracy)
        self._steps = _StepColumns()  # per-step (lr, sigma, q) as arrays
        # the SGD settings (beta, dampening, nesterov, weight decay), run-length encoded
        self._opt = _SettingRuns()
        self._settings: tuple[float, float, bool] | None = None  # (beta, dampening, nesterov)
        self._supported = True
        # the characteristic function kept step by step (built at the first query)
        self._characteristic: IncrementalCharacteristic | None = None
        self._cache: dict[float, tuple[int, WeightedHeuristicResult]] = {}

    # -- the run ----------------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        return self._steps.size

    @property
    def supported(self) -> bool:
        """Whether the characteristic-function route applies (module docstring)."""
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
            self._supported = False
            self._characteristic = None
        self._steps.append(float(lr), float(noise_multiplier), float(sample_rate))
        self._opt.append((beta, float(dampening), bool(nesterov), float(weight_decay)))

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
        """:meth:`append` for each step of these per-step arrays, in order."""
        lr = np.asarray(lrs, dtype=float)
        if not lr.size:
            return
        beta = np.asarray(momentum, dtype=float)
        damp = np.asarray(dampening, dtype=float)
        nest = np.asarray(nesterov, dtype=bool)
        wd = np.asarray(weight_decay, dtype=float)
        sigma = np.asarray(noise_multipliers, dtype=float)
        if self._settings is None:
            b0 = float(beta[0])
            self._settings = (b0, float(damp[0]) if b0 > 0 else 0.0, bool(nest[0]) and b0 > 0)
        b0, d0, n0 = self._settings
        same = (
            np.all(beta == b0)
            and np.all(np.where(beta > 0, damp, 0.0) == d0)
            and np.all((nest & (beta > 0)) == n0)
        )
        if not (same and np.all(wd == 0.0) and b0 < 1.0 and np.all(sigma > 0.0)):
            self._supported = False
            self._characteristic = None
        q = np.asarray(sample_rates, dtype=float)
        self._steps.extend(
            lr, np.broadcast_to(sigma, lr.shape), np.broadcast_to(q, lr.shape)
        )
        shape = lr.shape
        self._opt.extend(*(np.broadcast_to(v, shape) for v in (beta, damp, nest, wd)))

    # -- a checkpoint ---------------------------------------------------------------------------

    def characteristic_state(self) -> dict[str, Any] | None:
        """The kept characteristic function as plain lists and floats (None before the first
        query or outside the scope), so that a restored engine answers its next query without
        rebuilding it (O(T M))."""
        char = self._characteristic
        if char is None or not self._supported:
            return None
        return char.state(*self._steps.columns())

    def restore_characteristic(self, state: Mapping[str, Any]) -> bool:
        """Take up a :meth:`characteristic_state` saved for this run (the same steps, up to
        the steps appended since); False (nothing changed) if it is not for this run."""
        if not self._supported or self._settings is None:
            return False
        char = IncrementalCharacteristic.from_state(
            state, *self._steps.columns(), self._settings
        )
        if char is None:
            return False
        self._characteristic = char
        return True

    # -- queries ------------------------------------------------------------------------------

    def epsilon(self, delta: float) -> WeightedHeuristicResult:
        """Upper bound on the weighted heuristic epsilon at (validated) ``delta``, with a
        certified lower bound within ``accuracy`` relative; cached per step."""
        got = self._cache.get(delta)
        if got is not None and got[0] == self.num_steps:
            return got[1]
        res = self._solve(delta)
        self._cache[delta] = (self.num_steps, res)
        return res

    def epsilons(self, delta: float, count: int) -> list[WeightedHeuristicResult | None]:
        """:meth:`epsilon` after each of the last ``count`` steps, answered together by the
        kept characteristic function
        (:meth:`~.incremental_fourier.IncrementalCharacteristic.solve_steps`; one update and
        one root refinement per block of steps); None at a step it does not certify (outside
        its scope, or before its last query). The last one is cached as :meth:`epsilon`'s."""
        n = self.num_steps
        if not self._supported or not 0 < count <= n:
            return [None] * count
        assert self._settings is not None
        if self._characteristic is None:
            self._characteristic = IncrementalCharacteristic(*self._settings)
        got = self._characteristic.solve_steps(
            delta, *self._steps.columns(), self.accuracy, n - count
        )
        out: list[WeightedHeuristicResult | None] = []
        for i, answer in enumerate(got):
            if answer is None:
                out.append(None)
                continue
            upper, lower, terms = answer
            rel = (upper - lower) / upper if upper > 0 else 0.0
            out.append(WeightedHeuristicResult(
                upper, lower, rel, self.accuracy, False, 0, terms, 0.0, n - count + 1 + i,
                "epsilon", delta,
            ))  # fmt: skip
        if out and out[-1] is not None:
            self._cache[delta] = (n, out[-1])
        return out

    def _solve(self, delta: float) -> WeightedHeuristicResult:
        n = self.num_steps
        if n == 0:
            return WeightedHeuristicResult(
                0.0, 0.0, 0.0, self.accuracy, False, 0, 1, 0.0, 0, "epsilon", delta
            )
        if self._supported:
            got = self._fourier_solve(delta)
            if got is not None:
                return got
        return self._grid_solve(delta)

    def _fourier_solve(self, delta: float) -> WeightedHeuristicResult | None:
        """Route 1 (module docstring): the kept characteristic function, else one built for
        this query; None when both decline."""
        assert self._settings is not None
        char, new = self._characteristic, self._characteristic is None
        if char is None:
            char = self._characteristic = IncrementalCharacteristic(*self._settings)
        eta, sigma, q = self._steps.columns()
        got = char.solve(delta, eta, sigma, q, self.accuracy)
        if got is None and not new:  # a new one, built for this query alone
            fresh = IncrementalCharacteristic(*self._settings)
            got = fresh.solve(delta, eta, sigma, q, self.accuracy)
        if got is None:
            return None
        upper, lower, terms = got
        rel = (upper - lower) / upper if upper > 0 else 0.0
        return WeightedHeuristicResult(
            upper, lower, rel, self.accuracy, False, 0, terms, 0.0, self.num_steps,
            "epsilon", delta,
        )  # fmt: skip

    def _grid_solve(self, delta: float) -> WeightedHeuristicResult:
        """Route 2: the weight grid from scratch, for any trace."""
        m, d, nest, wd = self._opt.per_step()
        eta, sigma, q = self._steps.views()
        w = sgd_weights(
            eta, momentum=m, dampening=d, nesterov=bool(np.any(nest)), weight_decay=wd,
        )  # fmt: skip
        keep = w > 0
        return solve_trusted("epsilon", delta, w[keep], q[keep], sigma[keep], self.accuracy)


class _StepColumns:
    """Per-step (lr, sigma, q) in three float64 arrays grown by doubling (24 bytes a step,
    not three Python floats)."""

    def __init__(self) -> None:
        self.size = 0
        self._data = np.empty((3, 0), dtype=np.float64)

    def _reserve(self, extra: int) -> None:
        need = self.size + extra
        if need > self._data.shape[1]:
            grown = np.empty((3, max(need, 2 * self._data.shape[1], 64)), dtype=np.float64)
            grown[:, : self.size] = self._data[:, : self.size]
            self._data = grown

    def append(self, lr: float, sigma: float, q: float) -> None:
        self._reserve(1)
        self._data[:, self.size] = (lr, sigma, q)
        self.size += 1

    def extend(self, lr: np.ndarray, sigma: np.ndarray, q: np.ndarray) -> None:
        n = lr.size
        self._reserve(n)
        for row, values in enumerate((lr, sigma, q)):
            self._data[row, self.size : self.size + n] = values
        self.size += n

    def views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read-only (lr, sigma, q) views of the steps so far."""
        out = self._data[:, : self.size]
        out = out.view()
        out.setflags(write=False)
        return out[0], out[1], out[2]

    def columns(self) -> tuple[Any, Any, Any]:
        """:meth:`views` for the characteristic function's methods, which take any sequence
        of floats that numpy reads (they slice, take ``len`` and ``np.asarray``) although
        their annotations say ``list[float]``."""
        return self.views()


class _SettingRuns:
    """The per-step SGD settings (beta, dampening, nesterov, weight decay), run-length
    encoded: one row per run of equal settings."""

    def __init__(self) -> None:
        self._values: list[tuple[float, float, bool, float]] = []
        self._counts: list[int] = []

    def append(self, value: tuple[float, float, bool, float], count: int = 1) -> None:
        if self._values and self._values[-1] == value:
            self._counts[-1] += count
        else:
            self._values.append(value)
            self._counts.append(count)

    def extend(self, beta: np.ndarray, damp: np.ndarray, nest: np.ndarray, wd: np.ndarray) -> None:
        n = beta.size
        if not n:
            return
        change = np.flatnonzero(
            (beta[1:] != beta[:-1]) | (damp[1:] != damp[:-1]) | (nest[1:] != nest[:-1])
            | (wd[1:] != wd[:-1])
        ) + 1  # fmt: skip
        starts = np.concatenate(([0], change))
        ends = np.append(change, n)
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            self.append((float(beta[a]), float(damp[a]), bool(nest[a]), float(wd[a])), b - a)

    def per_step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(beta, dampening, nesterov, weight decay) per step."""
        counts = np.asarray(self._counts, dtype=np.int64)
        columns = list(zip(*self._values, strict=True)) if self._values else [(), (), (), ()]
        beta, damp, nest, wd = (np.asarray(c) for c in columns)
        return (
            np.repeat(beta.astype(float), counts), np.repeat(damp.astype(float), counts),
            np.repeat(nest.astype(bool), counts), np.repeat(wd.astype(float), counts),
        )  # fmt: skip
