"""The frequency grid of the kept characteristic function (``characteristic_grid``): its
scan tables against an independent long-double computation, in units of their rounding
charge."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.characteristic_grid import FrequencyGrid
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import FP_CHARGE

LD = np.longdouble


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
