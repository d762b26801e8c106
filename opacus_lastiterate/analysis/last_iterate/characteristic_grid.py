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

__all__ = ["PHASOR_CHARGE", "Q_HALF", "FrequencyGrid", "PairwiseSum", "c_q", "g_q", "log_factors"]

PHASOR_CHARGE = 4.0
"""Rounding charged per factor for :func:`log_factors`' half-angle products, in units of
``FP_CHARGE``, on top of what sines and cosines computed directly are charged: added to the
charge relative to abs(log f_t) and to that of each weight (module
:mod:`.incremental_fourier`)."""

Q_HALF = 1e-3
"""Steps with abs(q - 1/2) below this are never frozen (C(q) is unbounded there)."""
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


def log_factors(
    w: np.ndarray, q: np.ndarray, step: float, m: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(Re, Im) of log f_t(theta_k) = log(1 - q + q e^{i w theta_k}) at the frequencies
    theta_k = (k + 1/2) step, k < m, x steps (steps along the contiguous axis, so that numpy
    sums over them pairwise, as the rounding charge assumes), and (h, c) = (sin, cos) of the
    half angles w theta / 2: log abs(f)^2 = log1p(-4 q (1 - q) h^2) and
    arg f = atan2(2 q h c, 1 - 2 q h^2) (numpy's complex log is several times slower).

    The half angles are (k + 1/2) b with b = step w / 2, and k = j p + r with p about
    sqrt(m): their sines and cosines are products of those of j p b and (r + 1/2) b, each
    computed directly, so that about 2 sqrt(m) instead of m angles per step go through sin
    and cos (the factors take about a third less time). Each product adds about two ulps to h and c,
    without cancellation for angles up to pi / 2 (both terms of sin(a + b) have one sign);
    ``PHASOR_CHARGE`` charges it. Against long double, the error of each factor stays below
    a tenth of its share of the rounding charge of :mod:`.incremental_fourier` for sample
    rates at least 0.05 from 1/2, as it did with direct sines and cosines
    (``tests/analysis/last_iterate/test_characteristic_grid.py``)."""
    p = max(1, round(math.sqrt(m)))
    coarse = np.arange(0, m, p, dtype=float)
    half = 0.5 * step * w
    fine = np.multiply.outer(np.arange(p) + 0.5, half)
    fs, fc = np.sin(fine), np.cos(fine)
    big = np.multiply.outer(coarse, half)
    bs, bc = np.sin(big), np.cos(big)
    shape = (coarse.size * p, w.size)
    h = (bs[:, None, :] * fc + bc[:, None, :] * fs).reshape(shape)[:m]
    c = (bc[:, None, :] * fc - bs[:, None, :] * fs).reshape(shape)[:m]
    hh = h * h
    re = 0.5 * np.log1p((-4.0 * q * (1.0 - q)) * hh)
    im = np.arctan2((2.0 * q) * (h * c), 1.0 - (2.0 * q) * hh)
    return re, im, h, c


def c_q(q: np.ndarray) -> np.ndarray:
    """C(q) = q (1 - q) / (1 - 2 q)^2 (module docstring; huge near q = 1/2)."""
    return q * (1.0 - q) / np.maximum((1.0 - 2.0 * q) ** 2, 1e-300)


def g_q(q: np.ndarray) -> np.ndarray:
    """A bound on abs(g_t) = abs(q e^{i w theta} / f_t): q / abs(1 - 2 q) (capped at
    q / Q_HALF: steps that close to q = 1/2 are never frozen)."""
    return q / np.maximum(np.abs(1.0 - 2.0 * q), Q_HALF)
