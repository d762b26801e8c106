"""The per-step factors of the characteristic function (``step_factors``) against an
independent long-double computation, measured in units of the rounding charge that the
Fourier routes make for each factor; and the routes' refusal of sample rates near 1/2."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.step_factors import (
    PHASOR_CHARGE,
    Q_NEAR_HALF,
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


def _worst_share(rates: list[float], trials: int, seed: int) -> float:
    """The largest error of a factor against long double, in units of its charge: FP (4 +
    PHASOR_CHARGE + theta w_top) abs(log f_t) relative, plus theta g(q_t) w_t FP (4 +
    PHASOR_CHARGE) for the angle."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        m = int(rng.integers(1, 120))
        step = float(10 ** rng.uniform(-3, 0.5))
        t = int(rng.integers(1, 200))
        w = 10 ** rng.uniform(-3, 2, t)
        q = rng.choice(rates, t)
        theta = (np.arange(m) + 0.5) * step
        re, im, h, c = log_factors(w, q, step, m)
        want_re, want_im = _reference(w, q, theta)
        share = FP_CHARGE * (
            (np.abs(want_re) + np.abs(want_im)) * (4.0 + PHASOR_CHARGE + theta[:, None] * w.max())
            + g_q(q) * np.multiply.outer(theta, w) * (4.0 + PHASOR_CHARGE)
        )
        worst = max(worst, float(np.max(np.hypot(re - want_re, im - want_im) / share)))
        assert np.allclose(h * h + c * c, 1.0, rtol=0, atol=1e-14)  # unit phasors
    return worst


@pytest.mark.skipif(np.finfo(LD).nmant < 60, reason="needs an extended long double")
def test_log_factors_stay_well_inside_their_rounding_charge() -> None:
    """Measured: at most 0.07 of the charge (direct sines and cosines: the same), over sample
    rates from 1e-4 to 1 at least 0.05 from 1/2 and angles up to about 100 pi; up to the
    routes' limit Q_NEAR_HALF from 1/2, at most 0.42."""
    assert _worst_share([1e-4, 1e-3, 0.045, 0.3, 0.45, 0.55, 0.9, 1.0], 300, 7) < 0.25
    near = [0.5 - Q_NEAR_HALF, 0.5 + Q_NEAR_HALF]
    assert _worst_share(near, 150, 7) < 0.8


def test_log_factors_magnitude_bound_covers_each_factor() -> None:
    """The routes' ``size`` adds abs(Im) - Re per factor: Re <= 0, so it is at least the
    factor's magnitude."""
    rng = np.random.default_rng(3)
    w, q = 10 ** rng.uniform(-2, 2, 500), rng.uniform(1e-4, 1.0, 500)
    re, im, _, _ = log_factors(w, q, 0.05, 40)
    assert np.all(re <= 0.0)
    assert np.all(np.abs(im) - re >= np.hypot(re, im))


def test_the_fourier_route_declines_sample_rates_near_one_half() -> None:
    """A run with a step within Q_NEAR_HALF of q = 1/2 is declined by the characteristic
    function (the weight grid answers it), one just outside is answered."""
    from opacus_lastiterate.analysis.last_iterate.incremental_fourier import (
        IncrementalCharacteristic,
    )

    lrs = list(np.linspace(0.5, 0.05, 200))
    for q_odd, answered in ((0.5 - 0.9 * Q_NEAR_HALF, False), (0.5 - 1.5 * Q_NEAR_HALF, True)):
        q = [0.05] * 200
        q[120] = q_odd
        sigma = [4.0] * 200
        char = IncrementalCharacteristic(0.9, 0.0, False)
        kept = char.solve(1e-5, lrs, sigma, q, 1e-3)
        assert (kept is not None) == answered
