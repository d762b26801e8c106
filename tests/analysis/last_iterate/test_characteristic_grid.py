"""The per-step factors of the kept characteristic function (``characteristic_grid``)
against an independent long-double computation, measured in units of the rounding charge
that ``incremental_fourier`` makes for each factor."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.characteristic_grid import (
    PHASOR_CHARGE,
    FrequencyGrid,
    g_q,
    log_factors,
)
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import FP_CHARGE

LD = np.longdouble


def _reference(w: np.ndarray, q: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """log f_t(theta_k) in long double (64-bit mantissa on x86: 11 more bits than float)."""
    half = np.multiply.outer(LD(0.5) * theta.astype(LD), w.astype(LD))
    h, c, qq = np.sin(half), np.cos(half), q.astype(LD)
    re = LD(0.5) * np.log1p(-LD(4) * qq * (1 - qq) * h * h)
    im = np.arctan2(2 * qq * h * c, 1 - 2 * qq * h * h)
    return re.astype(float), im.astype(float)


@pytest.mark.skipif(np.finfo(LD).nmant < 60, reason="needs an extended long double")
def test_log_factors_stay_well_inside_their_rounding_charge() -> None:
    """The charge per factor (module incremental_fourier): FP (4 + PHASOR_CHARGE + theta
    w_top) abs(log f_t) relative, plus theta g(q_t) w_t FP (4 + PHASOR_CHARGE) for the angle.
    Measured: at most 0.07 of it (direct sines and cosines: the same), over sample rates
    from 1e-4 to 1 at least 0.05 from 1/2 and angles up to about 100 pi."""
    rng = np.random.default_rng(7)
    worst = 0.0
    for _ in range(300):
        m = int(rng.integers(1, 120))
        step = float(10 ** rng.uniform(-3, 0.5))
        t = int(rng.integers(1, 200))
        w = 10 ** rng.uniform(-3, 2, t)
        q = rng.choice([1e-4, 1e-3, 0.045, 0.3, 0.45, 0.55, 0.9, 1.0], t)
        theta = (np.arange(m) + 0.5) * step
        re, im, h, c = log_factors(w, q, step, m)
        want_re, want_im = _reference(w, q, theta)
        share = FP_CHARGE * (
            (np.abs(want_re) + np.abs(want_im)) * (4.0 + PHASOR_CHARGE + theta[:, None] * w.max())
            + g_q(q) * np.multiply.outer(theta, w) * (4.0 + PHASOR_CHARGE)
        )
        worst = max(worst, float(np.max(np.hypot(re - want_re, im - want_im) / share)))
        assert np.allclose(h * h + c * c, 1.0, rtol=0, atol=1e-14)  # unit phasors
    assert worst < 0.25, worst


def test_log_factors_magnitude_bound_covers_each_factor() -> None:
    """The grids' ``size`` adds abs(Im) - Re per factor: Re <= 0, so it is at least the
    factor's magnitude."""
    rng = np.random.default_rng(3)
    w, q = 10 ** rng.uniform(-2, 2, 500), rng.uniform(1e-4, 1.0, 500)
    re, im, _, _ = log_factors(w, q, 0.05, 40)
    assert np.all(re <= 0.0)
    assert np.all(np.abs(im) - re >= np.hypot(re, im))


@pytest.mark.skipif(np.finfo(LD).nmant < 60, reason="needs an extended long double")
def test_scan_tables_stay_inside_their_rounding_charge() -> None:
    """The grid's cos/sin tables of x_j theta_k (by angle addition from lo theta_k and a table
    of multiples of pi / 383) against long double, in units of the charge per frequency of
    incremental_fourier, FP (theta span + 4 + log2(m + 1)), on centred intervals (A < 0 < B,
    as the grids are built): measured at most 0.43 of it (sines and cosines of the products
    computed directly: 0.11)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(150):
        span = 10 ** rng.uniform(-1, 4.5)
        lo = -span * rng.uniform(0.05, 0.95)
        m = int(rng.integers(1, 200))
        grid = FrequencyGrid(1e-5, 2 * np.pi / span, m, lo, lo + span, 0.3)
        phase = np.multiply.outer(grid.xs.astype(LD), grid.theta.astype(LD))
        err = np.maximum(np.abs(grid.cos - np.cos(phase).astype(float)),
                         np.abs(grid.sin - np.sin(phase).astype(float)))  # fmt: skip
        charge = FP_CHARGE * (grid.theta * span + 4.0 + np.log2(m + 1))
        worst = max(worst, float(np.max(err / charge)))
    assert worst < 1.0, worst
