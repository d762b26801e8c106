"""Monte Carlo simulation of the normalised mechanisms and their exact log-likelihood ratios.

Each simulator draws the mechanism's output in the zero-other-gradients configuration of
``docs/normalisation.md`` (units of C, target gradient e, n other records with zero
gradient) for ``trials`` independent runs of ``steps`` steps, in the world with the target
(``with_target=True``) or without it, and returns the exact log(p_with / p_without) of each
run's whole output (a sum over steps, which are independent here). Thresholding these values
is the likelihood-ratio audit (:mod:`empirical`).

A d-dimensional output O is reduced to its sufficient statistics u = <O, e> and
v = ||O - u e||^2. ``full_vectors=True`` draws the d coordinates and reduces them (a check of
the reduction, memory ``trials * d``); otherwise v is drawn as a scaled chi-square, which has
the same distribution.

* :func:`simulate_asgm` with ``dimension=d``: O = (sum_{i in B} g_i + Z) / ``|B|`` in R^d, an
  empty batch reveals only that it was empty (the convention of :mod:`asgm`).
  ``dimension=None``: the "batch size revealed" observation (m, y) of :mod:`asgm`.
* :func:`simulate_divisor_leak`: O = Z / c1 without the target, (b e + Z) / c2 with it.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy import special, stats

from opacus_lastiterate.analysis._validation import (
    check_int,
    check_noise_multiplier,
    check_positive,
    check_sample_rate,
)
from opacus_lastiterate.analysis.normalisation.asgm import asgm_privacy_loss
from opacus_lastiterate.analysis.normalisation.divisor_leak import divisor_leak_loss

__all__ = [
    "simulate_asgm",
    "simulate_divisor_leak",
]

_CHUNK = 2_000_000  # floats per vectorised block
_PMF_FLOOR = 1e-40  # batch sizes rarer than this are left out of the likelihoods


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"`rng` must be a numpy.random.Generator, got {type(rng).__name__}.")
    return rng


def _projection_and_residual(
    rng: np.random.Generator, shift: NDArray, scale: NDArray, dimension: int, full: bool
) -> tuple[NDArray, NDArray]:
    """u and v of O = (shift e + sigma Z) / m, given ``shift`` = b and ``scale`` = sigma / m."""
    size = shift.shape[0]
    if dimension == 1:
        return shift + scale * rng.standard_normal(size), np.zeros(size)
    if not full:
        u = shift + scale * rng.standard_normal(size)
        return u, scale**2 * rng.chisquare(dimension - 1, size)
    u = np.empty(size)
    v = np.empty(size)
    rows = max(1, _CHUNK // dimension)
    for start in range(0, size, rows):
        sl = slice(start, start + rows)
        out = rng.standard_normal((len(u[sl]), dimension)) * scale[sl, None]
        out[:, 0] += shift[sl]  # e is the first coordinate
        u[sl] = out[:, 0]
        v[sl] = np.einsum("ij,ij->i", out[:, 1:], out[:, 1:])
    return u, v


def asgm_dimension_llr(u: NDArray, v: NDArray, n: int, q: float, sigma: float, d: int) -> NDArray:
    """Exact log(f_with(O) / f_without(O)) of a non-empty d-dimensional ASGM output.

    ``u``, ``v``: the output's summary statistics (as :func:`simulate_asgm` draws them),
    ``n`` other examples, sampling rate ``q``, noise multiplier ``sigma``, dimension ``d``
    (the real-code ASGM audit scores real Opacus outputs with it).
    """
    without = stats.binom(n, q)
    m = np.arange(1, n + 2, dtype=np.float64)
    log_k = without.logpmf(m)  # P(K = m), -inf at m = n + 1
    log_k1 = without.logpmf(m - 1)  # P(K = m - 1)
    keep = np.maximum(log_k, log_k1) > math.log(_PMF_FLOOR)
    m, log_k, log_k1 = m[keep], log_k[keep], log_k1[keep]
    base = d * np.log(m)  # the (m / sigma)^d density factor, sigma^d cancels
    inv = 1.0 / (2 * sigma * sigma)
    out = np.empty_like(u)
    rows = max(1, _CHUNK // len(m))
    for start in range(0, len(u), rows):
        su, sv = u[start : start + rows, None], v[start : start + rows, None]
        quad0 = (m * su) ** 2 + m * m * sv
        quad1 = (m * su - 1.0) ** 2 + m * m * sv
        with np.errstate(invalid="ignore"):
            lw = np.logaddexp(
                math.log1p(-q) + log_k + base - quad0 * inv if q < 1 else -np.inf,
                math.log(q) + log_k1 + base - quad1 * inv,
            )
        lo = log_k + base - quad0 * inv
        out[start : start + rows] = special.logsumexp(lw, axis=1) - special.logsumexp(lo, axis=1)
    return out


def simulate_asgm(
    rng: np.random.Generator,
    *,
    trials: int,
    steps: int,
    other_records: int,
    sample_rate: float,
    noise_multiplier: float,
    with_target: bool,
    dimension: int | None = None,
    full_vectors: bool = False,
) -> NDArray[np.float64]:
    """Total log(p_with / p_without) of ``trials`` runs of T = ``steps`` ASGM steps (+inf
    when the all-sampled batch of size n + 1 is seen; in d dimensions the likelihood is over
    the unobserved batch size)."""
    rng = _check_rng(rng)
    trials = check_int("trials", trials, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    n = check_int("other_records", other_records, minimum=0)
    q = check_sample_rate(sample_rate)
    s = check_noise_multiplier(noise_multiplier)
    d = None if dimension is None else check_int("dimension", dimension, minimum=1)
    total = np.zeros(trials)
    for _ in range(steps):
        b = (rng.random(trials) < q) if with_target else np.zeros(trials, dtype=bool)
        m = rng.binomial(n, q, size=trials) + b
        if d is None:
            y = b + s * rng.standard_normal(trials)
            total += asgm_privacy_loss(m, y, other_records=n, sample_rate=q, noise_multiplier=s)
            continue
        empty = m == 0
        total[empty] += math.log1p(-q) if q < 1 else 0.0
        full = ~empty
        mm = m[full].astype(np.float64)
        u, v = _projection_and_residual(
            rng, b[full].astype(np.float64) / mm, s / mm, d, full_vectors
        )
        total[full] += asgm_dimension_llr(u, v, n, q, s, d)
    return total


def simulate_divisor_leak(
    rng: np.random.Generator,
    *,
    trials: int,
    steps: int,
    divisor_without: float,
    divisor_with: float,
    sample_rate: float,
    noise_multiplier: float,
    dimension: int,
    with_target: bool,
    full_vectors: bool = False,
) -> NDArray[np.float64]:
    """Total A(u) + B(v) (:func:`divisor_leak_loss`) of ``trials`` runs of T steps of
    (sum + Z) / c in d dimensions."""
    rng = _check_rng(rng)
    trials = check_int("trials", trials, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    c1 = check_positive("divisor_without", divisor_without)
    c2 = check_positive("divisor_with", divisor_with)
    q = check_sample_rate(sample_rate)
    s = check_noise_multiplier(noise_multiplier)
    d = check_int("dimension", dimension, minimum=1)
    total = np.zeros(trials)
    for _ in range(steps):
        if with_target:
            b = (rng.random(trials) < q).astype(np.float64)
            c = c2
        else:
            b = np.zeros(trials)
            c = c1
        u, v = _projection_and_residual(rng, b / c, np.full(trials, s / c), d, full_vectors)
        total += divisor_leak_loss(
            u,
            v,
            divisor_without=c1,
            divisor_with=c2,
            sample_rate=q,
            noise_multiplier=s,
            dimension=d,
        )
    return total
