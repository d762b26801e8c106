"""The epsilon Opacus's ``PRVAccountant`` prints (releases 1.3.0-1.6.0), without Opacus.

Opacus's default accountant from 1.3.0 is ``PRVAccountant`` (Gopi, Lee and Wutschitz,
"Numerical Composition of Differential Privacy", NeurIPS 2021). Its ``get_epsilon(delta)``
is not the exact epsilon of the subsampled Gaussian: it is the *upper end of an error
interval*, ``eps_estimate(delta - delta_error) + eps_error`` with ``eps_error = 0.01`` and
``delta_error = delta / 1000`` by default, computed on a grid whose size and mesh follow
from those errors. The release table's "reported" column is what a release prints, so it
is computed here with the same arithmetic, step by step:

1. the domain half-width ``L = max(eps_rdp(history, delta_error / 4),
   max_i eps_rdp((sigma_i, q_i, 1), delta_error / (8 T)), eps_error) + 3`` from the RDP
   accountant (Opacus's orders, improved conversion), T the total number of steps;
2. the mesh ``eps_error / sqrt(T log(12 / delta_error) / 2)`` and the aligned, even-sized
   grid on [-L, L];
3. each privacy-loss distribution of a Poisson-subsampled Gaussian step, truncated to
   [-L, L], discretised by differences of its CDF at the cell edges, and shifted so that
   its mean equals the continuous mean (numerical quadrature between fixed points: two
   point sets, one for 1.3.0-1.4.0 and one from 1.4.1);
4. each distinct (sigma, q) composed with itself by FFT, the results convolved pairwise;
5. epsilon from the composed distribution at ``delta - delta_error``, plus ``eps_error``.

This is a re-implementation (numpy and scipy, no torch), tested against Opacus 1.6's
``PRVAccountant`` to 1e-6 at several (q, sigma, T, delta) in ``tests/analysis``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta, check_positive

__all__ = []

PRVVariant = Literal["1.3", "1.4.1"]
PRV_VARIANTS: dict[str, str] = {
    "1.3": "Opacus 1.3.0-1.4.0: the mean is integrated between t_min, +-logspace(-5, -1, 5) "
    "and t_max (accountants/analysis/prv/prvs.py:97-104 at v1.3)",
    "1.4.1": "Opacus 1.4.1-1.6.0: the mean is integrated between t_min, "
    "+-logspace(-5, log10|t|, 10), 0 and t_max (accountants/analysis/prv/prvs.py at v1.6.0)",
}
"""The two PRV arithmetics of Opacus's releases (they differ only in the mean's quadrature)."""

History = Sequence[tuple[float, float, int]]


def _rdp_epsilon(history: History, delta: float) -> float:
    from opacus_lastiterate.analysis.baselines.rdp_conversion import (
        OPACUS_ORDERS,
        improved_conversion,
        subsampled_gaussian_rdp,
    )

    rdp = np.zeros(len(OPACUS_ORDERS))
    for sigma, q, steps in history:  # summed as Opacus's RDPAccountant sums its history
        rdp = rdp + subsampled_gaussian_rdp(q, sigma, steps, OPACUS_ORDERS)
    return float(improved_conversion(OPACUS_ORDERS, rdp, delta)[0])


@dataclass(frozen=True)
class _Grid:
    t_min: float
    t_max: float
    size: int
    shift: float = 0.0

    @classmethod
    def aligned(cls, t_min: float, t_max: float, dt: float) -> _Grid:
        lo = math.floor(t_min / dt) * dt
        hi = math.ceil(t_max / dt) * dt
        size = int(np.round((hi - lo) / dt)) + 1
        if size % 2:
            size += 1
            hi += dt
        return cls(lo, hi, size)

    @property
    def dt(self) -> float:
        return (self.t_max - self.t_min) / (self.size - 1)

    @property
    def points(self) -> np.ndarray:
        return np.linspace(self.t_min, self.t_max, self.size)

    def moved(self, by: float) -> _Grid:
        return _Grid(self.t_min + by, self.t_max + by, self.size, self.shift + by)


def _loss_cdf(t: np.ndarray | float, q: float, sigma: float) -> np.ndarray:
    """CDF of the privacy loss of one Poisson-subsampled Gaussian step (remove direction:
    the loss log((1 - q) + q e^{(2x - 1) / (2 sigma^2)}) with x ~ N(1, sigma^2) mixed with
    N(0, sigma^2)), zero below log(1 - q)."""
    from scipy.special import erfc

    t = np.asarray(t, dtype=float)
    above = t > math.log(1 - q)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z = np.log(np.where(above, (np.exp(t) + q - 1) / q, 1.0))
    r2 = math.sqrt(2.0)
    value = (
        1.0
        - q * erfc((2 * z * sigma**2 - 1) / (2 * r2 * sigma)) / 2
        - (1 - q) * erfc((2 * z * sigma**2 + 1) / (2 * r2 * sigma)) / 2
    )
    return np.where(above, value, 0.0)


class _Truncated:
    def __init__(self, q: float, sigma: float, t_min: float, t_max: float) -> None:
        self.q, self.sigma, self.t_min, self.t_max = q, sigma, t_min, t_max
        self._lo = _loss_cdf(t_min, q, sigma)
        self._mass = _loss_cdf(t_max, q, sigma) - self._lo

    def cdf(self, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        inside = (_loss_cdf(t, self.q, self.sigma) - self._lo) / self._mass
        return np.where(t < self.t_min, 0.0, np.where(t < self.t_max, inside, 1.0))

    def mean(self, variant: PRVVariant) -> float:
        from scipy import integrate

        if variant == "1.3":
            inner = np.logspace(-5, -1, 5)
            points = np.concatenate([[self.t_min], -inner[::-1], inner, [self.t_max]])
        else:
            lo_exp = int(np.log10(abs(self.t_min)))
            hi_exp = int(np.log10(self.t_max))
            points = np.concatenate(
                [
                    [self.t_min],
                    -np.logspace(start=lo_exp, stop=-5, num=10),
                    [0],
                    np.logspace(start=-5, stop=hi_exp, num=10),
                    [self.t_max],
                ]
            )
        total = 0.0
        for left, right in itertools.pairwise(points):
            area, _ = integrate.quad(self.cdf, left, right, limit=500)
            total += right * self.cdf(right) - left * self.cdf(left) - area
        return float(total)


def _discretise(tr: _Truncated, grid: _Grid, variant: PRVVariant) -> tuple[np.ndarray, _Grid]:
    centres = grid.points
    pmf = tr.cdf(centres + grid.dt / 2) - tr.cdf(centres - grid.dt / 2)
    shift = tr.mean(variant) - float(np.dot(centres, pmf))
    if abs(shift) >= grid.dt / 2:
        raise RuntimeError("the discrete mean differs from the continuous mean by dt/2 or more.")
    return pmf, grid.moved(shift)


def _self_compose(pmf: np.ndarray, grid: _Grid, times: int) -> tuple[np.ndarray, _Grid]:
    from scipy.fft import irfft, rfft

    out = irfft(rfft(pmf) ** times)
    roll = times - 1 + (len(out) // 2 if times % 2 == 0 else 0)
    return np.roll(out, roll), grid.moved(grid.shift * (times - 1))


def _compose_all(parts: list[tuple[np.ndarray, _Grid]]) -> tuple[np.ndarray, _Grid]:
    from scipy.signal import convolve

    while len(parts) > 1:
        merged = []
        if len(parts) % 2 == 1:
            merged.append(parts.pop())
        for (left, g_left), (right, g_right) in zip(parts[:-1:2], parts[1::2]):
            merged.append((convolve(left, right, mode="same"), g_left.moved(g_right.shift)))
        parts = merged
    return parts[0]


def _epsilon_at(pmf: np.ndarray, grid: _Grid, delta: float) -> float:
    t = grid.points
    tail = np.flip(np.flip(pmf).cumsum())
    tail_weighted = np.flip(np.flip(pmf * np.exp(-t)).cumsum())
    gap = np.exp(t) * tail_weighted - tail
    i = int(np.searchsorted(gap, -delta, side="left"))
    if i <= 0:
        raise RuntimeError("Opacus's PRV arithmetic cannot compute epsilon here.")
    return float(np.log((tail[i] - delta) / tail_weighted[i]))


def opacus_prv_epsilon(
    history: History,
    delta: float,
    *,
    eps_error: float = 0.01,
    delta_error: float | None = None,
    variant: PRVVariant = "1.4.1",
) -> float:
    """What Opacus's ``PRVAccountant.get_epsilon(delta)`` returns for ``history`` (Opacus's
    ``[(noise_multiplier, sample_rate, steps), ...]``): the upper end of its error interval,
    an estimate plus ``eps_error`` (module docstring), not an exact epsilon.

    Args:
        history: (sigma > 0, q in (0, 1), steps >= 1) segments.
        delta: in (0, 1).
        eps_error: Opacus's default 0.01.
        delta_error: Opacus's default ``delta / 1000``.
        variant: ``"1.3"`` for Opacus 1.3.0-1.4.0, ``"1.4.1"`` for 1.4.1-1.6.0
            (:data:`PRV_VARIANTS`).

    Raises:
        ValueError: for a bad argument; RuntimeError where Opacus raises too.
    """
    d = check_delta(delta)
    e_err = check_positive("eps_error", eps_error)
    d_err = d / 1000 if delta_error is None else check_positive("delta_error", delta_error)
    if variant not in PRV_VARIANTS:
        raise ValueError(f"`variant` must be one of {sorted(PRV_VARIANTS)}, got {variant!r}.")
    segments = [(float(s), float(q), int(k)) for s, q, k in history]
    if not segments:
        raise ValueError("`history` must have at least one (sigma, q, steps) segment.")
    for sigma, q, k in segments:
        if not (sigma > 0 and 0 < q < 1 and k >= 1):
            raise ValueError(
                f"each history segment needs sigma > 0, q in (0, 1) and steps >= 1, got "
                f"{(sigma, q, k)}."
            )
    total = sum(k for _, _, k in segments)
    half_width = _rdp_epsilon(segments, d_err / 4)
    for sigma, q, _ in segments:
        half_width = max(half_width, _rdp_epsilon([(sigma, q, 1)], d_err / (8 * total)))
    half_width = max(half_width, e_err) + 3
    mesh = e_err / np.sqrt(total * np.log(12 / d_err) / 2)
    grid = _Grid.aligned(-half_width, half_width, mesh)
    if np.finfo(np.longdouble).eps * grid.size > d - d_err:
        raise ValueError(
            "Floating point errors dominate at this delta (Opacus raises the same): increase "
            "delta or reduce the domain."
        )
    parts = [
        _self_compose(*_discretise(_Truncated(q, sigma, grid.t_min, grid.t_max), grid, variant), k)
        for sigma, q, k in segments
    ]
    pmf, composed = _compose_all(parts)
    return _epsilon_at(pmf, composed, d - d_err) + e_err
