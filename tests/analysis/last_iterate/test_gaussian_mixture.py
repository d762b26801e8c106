"""The mixture pair's building blocks against independent high-precision sums (mpmath)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture


def _mp_log_tail(log_weights: np.ndarray, z: np.ndarray) -> float:
    """log sum_k w_k Phi(z_k) in 50-digit arithmetic."""
    with mpmath.workdps(50):
        total = mpmath.fsum(
            mpmath.exp(mpmath.mpf(float(lw))) * mpmath.ncdf(mpmath.mpf(float(zk)))
            for lw, zk in zip(log_weights, z, strict=True)
        )
        return float(mpmath.log(total))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("centre", [0.0, -5.0, -20.0, -36.0, -45.0, 8.0])
def test_tail_sums_keep_relative_precision_in_both_paths(seed, centre):
    """Linear-space sums (the fast path) and log-space sums (the fallback when the linear
    sum would lose precision to underflow) both agree with 50-digit sums to 1e-13."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    shifts = np.sort(rng.uniform(0.0, 30.0, n))
    log_weights = rng.uniform(-400.0, 0.0, n) if seed % 2 else rng.normal(-3.0, 2.0, n)
    pair = ShiftedGaussianMixture(shifts, log_weights, scale=1.0 + rng.uniform(0.0, 3.0))
    z = centre + rng.normal(0.0, 2.0, n)
    got = pair._log_tail(z)
    want = _mp_log_tail(log_weights, z)
    assert math.isclose(got, want, rel_tol=1e-13, abs_tol=1e-13)


def test_tiny_weight_with_a_large_tail_is_not_lost():
    """A weight far below the largest one (its ratio underflows to 0) still counts when the
    large weight's tail is tinier still: the fast path must hand over to the log path."""
    log_weights = np.array([0.0, -800.0])
    z = np.array([-60.0, 3.0])  # Phi(-60) ~ e^-1804, far below e^-800 * Phi(3)
    pair = ShiftedGaussianMixture(np.array([0.0, 1.0]), log_weights, scale=1.0)
    assert math.isclose(pair._log_tail(z), _mp_log_tail(log_weights, z), rel_tol=1e-13)
