"""The per-step factors of the characteristic function of the weighted heuristic's X = K + Z
(:mod:`.incremental_fourier`, the inversion of :mod:`.weighted_fourier`):
f_t(theta) = 1 - q_t + q_t e^{i w_t theta}, their logarithms at the frequencies
(k + 1/2) Delta, and the constants of their rounding charge and of the freezing remainder.

No complex logarithm is taken: log abs(f)^2 = log1p(-4 q (1 - q) h^2) and
arg f = atan2(2 q h c, 1 - 2 q h^2), with (h, c) the sine and cosine of the half angle, which
keeps each factor accurate relative to its size even where it is tiny (at low frequencies
numpy's complex log1p, which computes log(1 + z), is off by about an ulp absolute: summed over
a 10^4-step run, 0.6 of the rounding charge, against 0.02 this way).
Near q = 1/2, f vanishes at w theta = pi and log1p is ill-conditioned near -1: steps with
abs(q - 1/2) below :data:`Q_NEAR_HALF` are declined by both Fourier routes.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "Q_NEAR_HALF",
]

PHASOR_CHARGE = 4.0
"""Rounding charged per factor for :func:`log_factors`' half-angle products, in units of
``FP_CHARGE``, on top of what sines and cosines computed directly are charged: added to the
charge relative to abs(log f_t) and to that of each weight (module
:mod:`.incremental_fourier`)."""

Q_HALF = 1e-3
"""The least abs(1 - 2 q) that :func:`g_q` divides by (the Fourier routes decline runs with
q that close to 1/2 anyway: :data:`Q_NEAR_HALF`)."""
Q_NEAR_HALF = 0.01
"""Runs with a step whose abs(q - 1/2) is below this are declined by the Fourier routes (the
caller answers on its grid): there a factor's error can exceed its rounding charge (against
long double: 0.42 of it at q = 0.49, 1.4 at 0.498, 2.5 at 0.499)."""


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
    and cos. Each product adds about two ulps to h and c, without cancellation for angles up
    to pi / 2 (both terms of sin(a + b) have one sign); ``PHASOR_CHARGE`` charges it.
    Against long double, the error of each factor stays below a tenth of its share of the
    rounding charge of the Fourier routes for sample rates at least 0.05 from 1/2, as it did
    with direct sines and cosines (``tests/analysis/last_iterate/test_step_factors.py``)."""
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
    q / Q_HALF)."""
    return q / np.maximum(np.abs(1.0 - 2.0 * q), Q_HALF)
