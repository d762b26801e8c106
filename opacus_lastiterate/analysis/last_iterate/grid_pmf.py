"""A discretised count distribution on a grid, folded one Bernoulli step at a time.

:class:`GridPmf` is the state of the weighted heuristic's grid route
(:mod:`.incremental_weighted`): Pr[K = (offset + i) c] = p[i], where each step adds
k Bernoulli(q) grid cells (the step's weight rounded up for the upper pmf, down for the lower
one), tails of at most a stated mass are cut (and kept as ``dropped``), and the pmf is turned
into the pair of Gaussian mixtures whose hockey-stick divergence bounds the heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import _cut_length

__all__ = ["GridPmf"]


@dataclass
class GridPmf:
    """Pr[K = (offset + i) c] = p[i]; ``zero``: extra mass at shift 0 (lower pmfs);
    ``dropped``: mass cut off the upper end (upper pmfs, added to delta).

    :meth:`fold` writes into scratch arrays that the pmf owns and reuses (allocating a new
    array per fold costs about five times the arithmetic at a million points: the pages of
    every fresh array are faulted in again). ``p`` may be a view into one of them; an array
    handed to a :meth:`copy` is never written again by the original."""

    p: np.ndarray
    offset: int = 0
    zero: float = 0.0
    dropped: float = 0.0
    upper: bool = True
    _scratch: list[np.ndarray | None] = field(
        default_factory=lambda: [None, None, None], repr=False, compare=False
    )

    def copy(self) -> GridPmf:
        for i, buf in enumerate(self._scratch):  # give up the array that p lives in
            if buf is not None and np.may_share_memory(buf, self.p):
                self._scratch[i] = None
        return GridPmf(self.p, self.offset, self.zero, self.dropped, self.upper)

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state["p"] = np.array(self.p)  # the values only, not the scratch arrays
        state["_scratch"] = [None, None, None]
        return state

    def _two_free(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Two scratch arrays of size >= n that do not overlap ``p``."""
        out: list[np.ndarray] = []
        for i, buf in enumerate(self._scratch):
            if buf is not None and np.may_share_memory(buf, self.p):
                continue
            if buf is None or buf.size < n:
                buf = self._scratch[i] = np.empty(n + n // 4)
            out.append(buf)
            if len(out) == 2:
                break
        return out[0], out[1]

    def fold(self, k: int, q: float) -> None:
        """K <- K + k Bernoulli(q) by p <- (1 - q) p + q shift_k(p) (non-negative sums)."""
        if k <= 0:
            return
        if q >= 1.0:
            self.offset += k
            return
        p = self.p
        m, n = p.size, p.size + k
        out, shifted = self._two_free(n)
        np.multiply(p, 1.0 - q, out=out[:m])
        out[m:n] = 0.0
        np.multiply(p, q, out=shifted[:m])
        out[k:n] += shifted[:m]
        self.p = out[:n]

    def trim(self, budget: float) -> None:
        """Cut each tail whose mass is <= budget (module docstring, item 5)."""
        p = self.p
        i, lo = _cut_length(p, budget)
        j, hi = _cut_length(p[::-1], budget)
        if i + j >= p.size or (i == 0 and j == 0):
            return
        size = p.size - i - j
        kept = self._two_free(size)[0][:size]
        np.copyto(kept, p[i : p.size - j])
        if self.upper:
            kept[0] += lo  # moved up
            self.dropped += hi
        else:
            self.zero += lo + hi  # moved down to shift 0
        self.p, self.offset = kept, self.offset + i

    def rebin(self, m: int) -> GridPmf:
        """The law on the grid m times coarser: each point rounded up (upper) or down."""
        if m == 1:
            return self.copy()
        off = self.offset
        if self.upper:  # bin j holds [(j-1) m + 1, j m]
            j0 = -(-off // m)
            pad = off - ((j0 - 1) * m + 1)
        else:  # bin j holds [j m, (j+1) m - 1]
            j0 = off // m
            pad = off - j0 * m
        n = pad + self.p.size
        buf = np.zeros(-(-n // m) * m)
        buf[pad:n] = self.p
        return GridPmf(buf.reshape(-1, m).sum(axis=1), j0, self.zero, self.dropped, self.upper)

    def refine(self, m: int) -> GridPmf:
        """The same law on a grid m times finer (exact)."""
        buf = np.zeros((self.p.size - 1) * m + 1)
        buf[::m] = self.p
        return GridPmf(buf, self.offset * m, self.zero, self.dropped, self.upper)

    def pair(self, c: float, scale: float) -> ShiftedGaussianMixture | None:
        shifts = (self.offset + np.arange(self.p.size)) * c
        p = self.p
        if self.zero > 0.0:
            shifts, p = np.r_[0.0, shifts], np.r_[self.zero, p]
        if not np.any((shifts > 0) & (p > 0)):
            return None  # P == Q (on the kept support)
        with np.errstate(divide="ignore"):
            log_p = np.log(p)
        return ShiftedGaussianMixture(shifts, log_p, scale, self.dropped if self.upper else 0.0)
