"""The frequency grid of the kept characteristic function (:mod:`.incremental_fourier`):
the frequencies (k + 1/2) Delta, the scan lattice on [A, B] with its cos/sin tables, and the
sums over the frozen steps at those frequencies (log f_t at their frozen weights, kept as a
pairwise sum; their magnitudes; the first-order term and its companion sums), with the
per-step factors they are made of.

Sums over steps run along numpy's contiguous axis (numpy sums there pairwise), in blocks of
about ``_CHUNK_ELEMENTS`` frequencies x steps (64 kB arrays: reused heap memory, no fresh
pages per block), whose sums :class:`PairwiseSum` adds pairwise: the rounding is that of a
pairwise sum, as :mod:`.incremental_fourier` charges it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.last_iterate.fourier_roots import Hints
from opacus_lastiterate.analysis.last_iterate.step_factors import g_q, log_factors
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import MAX_TERMS, chernoff_upper

__all__ = []

_SCAN = 384  # lattice points on [A, B]
_CHUNK_ELEMENTS = 8192  # frequencies x steps per block when steps are folded
_MIN_CHUNK = 16
_C_CUT = 1e-16  # steps folded with a growth coefficient below this: no first-order term
_SCALARS = ("delta", "step", "m", "lo", "hi", "lam", "a0", "b0", "expm1", "drop_x", "drop_y",
            "w_round", "version")  # fmt: skip
_REAL = ("size", "first_abs", "first_abs_y")
_COMPLEX = ("first", "first_y")


class PairwiseSum:
    """A running sum of vectors added in blocks, kept as partial sums of equal size classes
    (a binary counter), so that its rounding is that of a pairwise sum."""

    def __init__(self, m: int) -> None:
        self.parts: list[tuple[int, np.ndarray]] = []
        self.m = m

    def add(self, count: int, vec: np.ndarray) -> None:
        self.parts.append((count, vec))
        while len(self.parts) > 1 and self.parts[-2][0] <= self.parts[-1][0]:
            c2, v2 = self.parts.pop()
            c1, v1 = self.parts.pop()
            self.parts.append((c1 + c2, v1 + v2))

    def total(self) -> np.ndarray:
        out = np.zeros(self.m, complex)
        for _, v in self.parts:
            out += v
        return out


@functools.lru_cache(maxsize=8)
def _lattice_turns(m: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of pi j (2k + 1) / (_SCAN - 1) for the lattice points j and frequencies
    k < m (the scan's phases less lo theta_k), from a table of the multiples of
    pi / (_SCAN - 1): read-only, shared by the grids with m frequencies."""
    turns = 2 * (_SCAN - 1)
    angle = np.pi * np.arange(turns) / (_SCAN - 1)
    n = np.multiply.outer(np.arange(_SCAN), 2 * np.arange(m) + 1) % turns
    cb, sb = np.cos(angle)[n], np.sin(angle)[n]
    cb.flags.writeable = sb.flags.writeable = False
    return cb, sb


class FrequencyGrid:
    """Frequencies, the scan lattice and the frozen steps' sums at them."""

    def __init__(self, delta: float, step: float, m: int, lo: float, hi: float, lam: float):
        self.delta, self.step, self.m, self.lo, self.hi, self.lam = delta, step, m, lo, hi, lam
        self.a0, self.b0 = lo, hi  # A and B of the run when the grid was made (its margins)
        self.k = np.arange(m) + 0.5
        self.theta = self.k * step
        self.xs = np.linspace(lo, hi, _SCAN)
        # x_j theta_k = lo theta_k + pi j (2k + 1) / (_SCAN - 1) (step = 2 pi / (hi - lo)):
        # cos and sin of the first part, times those of the second (a table of multiples of
        # pi / (_SCAN - 1)), by angle addition: a few ulps, inside the charge theta span
        a = lo * self.theta
        ca, sa = np.cos(a), np.sin(a)
        cb, sb = _lattice_turns(m)
        self.cos, self.sin = ca * cb - sa * sb, sa * cb + ca * sb
        self.log0 = PairwiseSum(m)  # sum of log f_t at the frozen weights
        self.size = np.zeros(m)  # sum of their magnitudes
        self.first = np.zeros(m, complex)  # sum_t u_t rho_t(T), u_t = i theta g_t c_t
        self.first_y = np.zeros(m, complex)  # sum_t u_t beta^(T + 1 - j_t)
        self.first_abs = np.zeros(m)  # the same two sums of abs(u_t)
        self.first_abs_y = np.zeros(m)
        self.expm1 = 0.0  # sum_t q_t expm1(lam w^f)
        self.drop_x = self.drop_y = 0.0  # sum q/|1-2q| c_t (rho_t, beta^(T+1-j_t)), no u_t
        self.w_round = 0.0  # rounding of the weights refrozen at the build
        self.cache: tuple[int, np.ndarray] | None = None  # (parts version, log0 total)
        self.hints: Hints = {}  # the roots' last positions (fourier_roots.solve_epsilons)
        self.version = 0

    def fold(self, w: np.ndarray, q: np.ndarray, c: np.ndarray) -> None:
        """Add steps frozen now (weights w, sample rates q, growth coefficients c; rho_t = 0)
        to the sums; the first-order term only where c_t > ``_C_CUT`` (the others are
        charged to ``drop``: its error is at most theta q / abs(1 - 2 q) c_t rho_t)."""
        big = c > _C_CUT  # c grows along the steps (older first): a prefix is dropped
        cut = int(np.argmax(big)) if big.any() else c.size
        if cut:
            self.drop_y += float(np.dot(g_q(q[:cut]), c[:cut]))
        chunk = max(_MIN_CHUNK, _CHUNK_ELEMENTS // self.m)
        i_theta = 1j * self.theta[:, None]
        for i in range(0, w.size, chunk):
            sl = slice(i, i + chunk)
            re, im, h, c_half = log_factors(w[sl], q[sl], self.step, self.m)
            re_sum = re.sum(axis=1)
            self.log0.add(re.shape[1], re_sum + 1j * im.sum(axis=1))
            self.size += np.abs(im).sum(axis=1) - re_sum  # >= sum abs(log f): re <= 0
            lo = max(cut - i, 0)
            if lo < re.shape[1]:
                hl, cl = h[:, lo:], c_half[:, lo:]
                qi, z = q[sl][lo:], (1.0 - 2.0 * hl * hl) + 2j * (hl * cl)
                u = i_theta * (qi * z / (1.0 + qi * (z - 1.0))) * c[sl][lo:]
                self.first_y += u.sum(axis=1)
                self.first_abs_y += np.abs(u).sum(axis=1)
        self.expm1 += float(np.dot(q, np.expm1(self.lam * w)))
        self.version += 1

    def advance(self, rho: float, decay: float) -> None:
        """The first-order sums after steps whose R_{T+1}(T') is ``rho``, ``decay`` =
        beta^(T' - T)."""
        self.first += rho * self.first_y
        self.first_y *= decay
        self.first_abs += rho * self.first_abs_y
        self.first_abs_y *= decay
        self.drop_x += rho * self.drop_y
        self.drop_y *= decay

    def log_frozen(self) -> np.ndarray:
        if self.cache is None or self.cache[0] != self.version:
            self.cache = (self.version, self.log0.total())
        return self.cache[1]

    # -- a checkpoint -------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        """The grid's sums as plain lists and floats (every float round-trips exactly)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in _SCALARS}
        out.update({k: getattr(self, k).tolist() for k in _REAL})
        for k in _COMPLEX:
            out[k] = [getattr(self, k).real.tolist(), getattr(self, k).imag.tolist()]
        out["log0"] = [[c, v.real.tolist(), v.imag.tolist()] for c, v in self.log0.parts]
        out["hints"] = [[key[0], key[1], *val] for key, val in self.hints.items()]
        return out

    @classmethod
    def from_dict(cls, g: Mapping[str, Any]) -> FrequencyGrid:
        """The grid of :meth:`as_dict`.

        Raises:
            KeyError, TypeError, ValueError, IndexError: if ``g`` is not such a dict.
        """
        grid = cls(float(g["delta"]), float(g["step"]), int(g["m"]), float(g["lo"]),
                   float(g["hi"]), float(g["lam"]))  # fmt: skip
        for k in ("a0", "b0", "expm1", "drop_x", "drop_y", "w_round"):
            setattr(grid, k, float(g[k]))
        grid.version = int(g["version"])
        for k in _REAL:
            setattr(grid, k, np.array(g[k], dtype=float))
        for k in _COMPLEX:
            re, im = g[k]
            setattr(grid, k, np.array(re, dtype=float) + 1j * np.array(im, dtype=float))
        grid.log0.parts = [(int(c), np.array(re, float) + 1j * np.array(im, float))
                           for c, re, im in g["log0"]]  # fmt: skip
        grid.hints = {(bool(h[0]), float(h[1])): (float(h[2]), float(h[3]), float(h[4]),
                                                  float(h[5])) for h in g["hints"]}  # fmt: skip
        vectors = [getattr(grid, k) for k in (*_REAL, *_COMPLEX)]
        vectors += [v for _, v in grid.log0.parts]
        if not all(v.shape == (grid.m,) for v in vectors):
            raise ValueError("a vector of the grid is not of its length m")
        return grid


def new_grid(
delta: float, tail: float, s: float, mu: float, a_end: float, theta_min: float,
    w_now: np.ndarray, q_now: np.ndarray, *, margin: float,
) -> FrequencyGrid | None:
    """An empty grid for the run whose weights are ``w_now``: its interval [A, B] (the
    Chernoff bound at its best lambda), widened by ``margin`` of its span on each
    side, and its frequencies."""
    keep = w_now > 0
    if not keep.any():
        return None
    if not keep.all():  # else no copies (a long run's steps)
        w_now, q_now = w_now[keep], q_now[keep]
    try:
        b_unc, lam = chernoff_upper(w_now, q_now, s, tail)
    except (OverflowError, ValueError, FloatingPointError):
        return None
    b_end = b_unc - mu
    span = b_end - a_end
    if not (math.isfinite(span) and span > 0):
        return None
    lo, hi = a_end - margin * span, b_end + margin * span
    step = 2.0 * math.pi / (hi - lo)
    m = math.ceil(theta_min / step - 0.5) + 1
    if m > MAX_TERMS:
        return None
    # a little room for more frequencies (a smaller delta later at the same grid)
    grid = FrequencyGrid(delta, step, m + 2, lo, hi, lam)
    grid.a0, grid.b0 = a_end, b_end
    return grid
