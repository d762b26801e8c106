"""Exact privacy of the one-dimensional audit processes, by density evolution on a grid.

For :class:`~opacus_lastiterate.auditing.WorstCaseLandscape` (A_S^{h*}, Cebere, Bellet,
Papernot, "Tighter Privacy Auditing of DP-SGD in the Hidden State Threat Model",
arXiv:2405.14457, Section 6) the released theta_t is a nonlinear Markov chain

    theta_1 = b C + sigma C Z_1,     theta_{t+1} = theta_t + C s(theta_t) - (sigma C / B) Z_{t+1}

(s = +1 above h, -1 below). Its law with (b = 1) and without (b = 0) the canary is evolved
on a grid of cells of width ``grid_step`` (a multiple of C / 2 divides exactly, so the +-C
drift is a whole number of cells and h is a cell boundary); each noise step convolves the
cell masses with the cell-integrated Gaussian. The two discrete laws then give the exact
(eps, delta) curve of the *discretised* process; the discretisation error is what changes
when the grid is refined (:func:`worst_case_landscape_epsilons` reports it) and is checked at
t = 1 against the closed form (theta_1 is Gaussian: eps_1 = the GDP epsilon of mu = 1/sigma).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.signal import fftconvolve
from scipy.special import ndtr

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_int,
    check_noise_multiplier,
)
from opacus_lastiterate.auditing.adversaries import WorstCaseLandscape

__all__ = ["ExactEpsilons", "discrete_epsilon", "worst_case_landscape_epsilons"]

_SPAN_SD = 12.0  # grid and kernel half-widths, in standard deviations


def _delta_at(p: NDArray[np.float64], q: NDArray[np.float64], eps: float) -> float:
    """sum max(0, p - e^eps q): the hockey-stick divergence of two discrete laws."""
    return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))


def discrete_epsilon(
    p: NDArray[np.float64], q: NDArray[np.float64], delta: float, *, tol: float = 1e-9
) -> float:
    """Smallest eps with both hockey-stick divergences (P||Q, Q||P) <= delta, by bisection."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)

    def worst(eps: float) -> float:
        return max(_delta_at(p, q, eps), _delta_at(q, p, eps))

    if worst(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while worst(hi) > delta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return math.inf
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if worst(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class ExactEpsilons:
    """Exact epsilons of theta_1..theta_T (index t - 1) and their discretisation error.

    Attributes:
        epsilons: eps_t at the finer grid.
        error: ``|eps_t(grid) - eps_t(grid / 2)|``, per step (the stated error).
        lost_mass: probability mass that left the grid (added to neither law; < 1e-12 here).
    """

    epsilons: NDArray[np.float64]
    error: NDArray[np.float64]
    lost_mass: float


def _evolve(
    attack: WorstCaseLandscape, sigma: float, steps: int, dx: float, delta: float
) -> tuple[NDArray[np.float64], float]:
    c, b = attack.clipping_norm, attack.batch_size
    shift = round(c / dx)
    h_cells = attack.h / dx
    if abs(shift * dx - c) > 1e-9 * c or abs(h_cells - round(h_cells)) > 1e-9:
        raise ValueError(
            f"`grid_step` must divide the clipping norm {c} and the threshold {attack.h}, got {dx}."
        )
    s_step = sigma * c / b
    sd_total = math.sqrt((sigma * c) ** 2 + (steps - 1) * s_step**2)
    half = c * steps + _SPAN_SD * sd_total + c
    n_half = math.ceil(half / dx)
    centres = (np.arange(-n_half, n_half) + 0.5) * dx  # h = 0.5 C sits on a boundary
    up = centres > attack.h

    def gaussian_masses(mean: float, sd: float) -> NDArray[np.float64]:
        edges = np.r_[centres - dx / 2, centres[-1] + dx / 2]
        return np.diff(ndtr((edges - mean) / sd))

    k_half = max(1, math.ceil(_SPAN_SD * s_step / dx))
    offsets = np.arange(-k_half, k_half + 1) * dx
    kernel = ndtr((offsets + dx / 2) / s_step) - ndtr((offsets - dx / 2) / s_step)
    laws = [gaussian_masses(c, sigma * c), gaussian_masses(0.0, sigma * c)]
    eps = [discrete_epsilon(laws[0], laws[1], delta)]
    lost = 0.0
    for _ in range(1, steps):
        new = []
        for law in laws:
            moved = np.zeros_like(law)
            moved[shift:] += np.where(up, law, 0.0)[:-shift]  # +C above h
            moved[:-shift] += np.where(up, 0.0, law)[shift:]  # -C below h
            out = fftconvolve(moved, kernel, mode="same")
            out = np.maximum(out, 0.0)  # FFT round-off
            lost = max(lost, float(law.sum() - out.sum()))
            new.append(out)
        laws = new
        eps.append(discrete_epsilon(laws[0], laws[1], delta))
    return np.array(eps), lost


def worst_case_landscape_epsilons(
    attack: WorstCaseLandscape,
    *,
    noise_multiplier: float,
    steps: int,
    delta: float,
    grid_step: float = 0.01,
) -> ExactEpsilons:
    """Exact eps_t (t = 1..steps) of A_S^{h*} at ``delta``, with its discretisation error.

    Evolves both laws at ``grid_step`` and at ``grid_step / 2``; reports the finer values and
    their difference from the coarser ones as the error.
    """
    if not isinstance(attack, WorstCaseLandscape):
        raise TypeError(f"`attack` must be a WorstCaseLandscape, got {attack!r}.")
    sigma = check_noise_multiplier(noise_multiplier)
    t = check_int("steps", steps, minimum=1)
    d = check_delta(delta)
    dx = check_in_interval("grid_step", grid_step, 0.0, attack.clipping_norm)
    coarse, lost_c = _evolve(attack, sigma, t, dx, d)
    fine, lost_f = _evolve(attack, sigma, t, dx / 2, d)
    return ExactEpsilons(fine, np.abs(fine - coarse), max(lost_c, lost_f))
