"""Opacus's RDP accountant, added to one step at a time: a cheap upper bound.

:class:`IncrementalRDP` keeps one RDP vector over Opacus's orders for the steps recorded so
far and converts any number of such vectors to epsilon in one vectorised pass. It is the
``opacus_rdp_epsilon`` that the privacy monitor logs beside the heuristic at every step and
that its budget guard uses to certify steps ahead. It is not the registry's ``"standard_rdp"``
(:class:`~opacus_lastiterate.analysis.baselines.composition.RDPComposition`, dp_accounting's
orders and per-step RDP): dp_accounting bounds the RDP of fractional orders from above (by up
to a few percent at the optimal order), Opacus evaluates it (agreeing with numerical
integration to about 1e-11), so the registry's value can be larger (0.22% in epsilon at
T = 1000, q = 0.02, sigma = 0.6, delta = 1e-5); and the registry's model is recomputed from scratch at each query (50-350 ms)
where this class adds one vector per step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import numpy as np

from opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp import poisson_gaussian_rdp

__all__ = []


@functools.lru_cache(maxsize=256)
def _per_step_rdp(
    noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]
) -> np.ndarray:
    """RDP of one step at ``orders`` (read-only; shared by every monitor in the process):
    Opacus's ``compute_rdp`` series, evaluated vectorised over orders
    (:func:`~opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp.poisson_gaussian_rdp`,
    ``series="opacus"``)."""
    vec = poisson_gaussian_rdp([sample_rate], [noise_multiplier], orders, series="opacus")[0]
    vec.setflags(write=False)
    return vec


class IncrementalRDP:
    """Standard composition by RDP: one vector over orders, added to once per step.

    The per-step RDP of the Poisson-subsampled Gaussian (the series of Opacus's
    ``compute_rdp``, the Mironov et al. bound, vectorised over orders; its tail summed whole,
    within 5e-13 / (a - 1) of Opacus's truncated sum) is cached per distinct (sigma, q).
    The conversion to epsilon is the formula of Opacus's ``get_privacy_spent`` (min over
    orders), evaluated for many vectors at once with the same floating-point operations. An
    upper bound on the standard epsilon, looser than the PLD value.
    """

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        from opacus.accountants import RDPAccountant

        self.orders = np.asarray(
            RDPAccountant.DEFAULT_ALPHAS if orders is None else orders, dtype=float
        )
        self.rdp = np.zeros_like(self.orders)
        self._cache: dict[tuple[float, float], np.ndarray] = {}
        self._conversion: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self.previous = self.rdp

    def _per_step(self, noise_multiplier: float, sample_rate: float) -> np.ndarray:
        key = (noise_multiplier, sample_rate)
        vec = self._cache.get(key)
        if vec is None:
            vec = _per_step_rdp(noise_multiplier, sample_rate, tuple(self.orders.tolist()))
            self._cache[key] = vec
        return vec

    def _fill(self, steps: Sequence[tuple[float, float]]) -> None:
        """Cache the per-step vectors of the (sigma, q) pairs of ``steps`` not seen yet, in
        one call over all of them (a noise schedule: a new pair at every step; the series
        run on many pairs at once cost about half as much a pair, with the same floats)."""
        cache = self._cache
        new = list(dict.fromkeys(key for key in steps if key not in cache))
        if len(new) < 2:
            return
        sigmas, rates = zip(*new, strict=True)
        rows = poisson_gaussian_rdp(rates, sigmas, self.orders, series="opacus")
        rows.setflags(write=False)
        for key, row in zip(new, rows, strict=True):
            cache[key] = row

    def add(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Compose ``steps`` more steps at (sigma, q)."""
        self.rdp = self.rdp + steps * self._per_step(noise_multiplier, sample_rate)

    def reset(self, history: Iterable[tuple[float, float, int]] = ()) -> None:
        """Start again from an Opacus history ``[(sigma, q, steps), ...]``."""
        self.rdp = np.zeros_like(self.orders)
        for sigma, q, steps in history:
            self.add(float(sigma), float(q), int(steps))

    def _rows(self, steps: Sequence[tuple[float, float]], extra: int = 0,
              last: tuple[float, float] | None = None) -> np.ndarray:
        """The vectors after each of ``steps`` and then ``extra`` steps at ``last``: the
        running sums, added one step at a time as :meth:`add` does (row 0 is the current
        vector)."""
        self._fill(steps)
        vectors = [self.rdp] + [self._per_step(s, q) for s, q in steps]
        if extra:
            assert last is not None
            vectors.append(np.broadcast_to(self._per_step(*last), (extra, self.orders.size)))
        return np.cumsum(np.vstack(vectors), axis=0)

    def epsilons(self, rows: np.ndarray, delta: float) -> np.ndarray:
        """Epsilon of each RDP vector (row) at ``delta``: min over orders of
        rdp - (log(delta) + log(a)) / (a - 1) + log((a - 1) / a); 0 for a zero vector,
        inf for one with an infinite entry."""
        conv = self._conversion.get(delta)
        if conv is None:
            a = self.orders
            conv = self._conversion[delta] = (
                (np.log(delta) + np.log(a)) / (a - 1),
                np.log((a - 1) / a),
            )
        rows = np.atleast_2d(rows)
        with np.errstate(invalid="ignore"):
            eps = (rows - conv[0]) + conv[1]
        finite = np.all(np.isfinite(rows), axis=1)
        out = np.full(rows.shape[0], math.inf)
        if np.any(finite):
            out[finite] = np.nanmin(eps[finite], axis=1)
        out[~np.any(rows, axis=1)] = 0.0
        return out

    def epsilon(self, delta: float) -> float:
        """Epsilon of the current vector (0 before any step)."""
        return float(self.epsilons(self.rdp, delta)[0])

    def advance(self, steps: Sequence[tuple[float, float]], delta: float) -> np.ndarray:
        """Compose ``steps`` [(sigma, q), ...] one by one; the epsilon after each
        (:attr:`previous`: the vector before the last of them)."""
        rows = self._rows(steps)
        self.previous = rows[-2].copy()
        self.rdp = rows[-1].copy()
        return self.epsilons(rows[1:], delta)

    def lookahead(
        self,
        steps: Sequence[tuple[float, float]],
        extra: int,
        last: tuple[float, float],
        delta: float,
    ) -> np.ndarray:
        """The epsilon after each of ``steps`` and then ``extra`` steps at ``last``, as
        :meth:`advance` would compute them, without composing them."""
        return self.epsilons(self._rows(steps, extra, last)[1:], delta)
