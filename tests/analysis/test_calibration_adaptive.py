"""Calibration of an AdamW run (``calibrate_noise_multiplier(..., optimizer_settings=...)``):
the noise multiplier returned, fed to the from-scratch weighted heuristic with the adaptive
weights recomputed at that sigma (``privacy_model("heuristic", DPSGDRun(..., weights=
adaptive_weights(settings, noise_std=sigma C / B)))``), meets the target within the stated
tolerance, and a bisection on that from-scratch model, written here, finds the same sigma.

Tolerance: the calibration answers through the kept engine (an upper bound within its
accuracy, 1e-3 relative) and returns sigma within ``rtol`` = 1e-4 on the safe side; the
from-scratch model is an upper bound within 1e-3 too. So the from-scratch epsilon at the
calibrated sigma lies within 3e-3 relative of the target.

For AdamW at a constant noise multiplier the weights do not depend on sigma up to a common
factor (the bias-corrected frozen second moment is the same at every step); with Adam's L2
weight decay, folded into the gradient and divided by the second moment, they do: there the
weights computed at sigma = 1 would give another epsilon at the calibrated sigma, and the
calibration must recompute them at each sigma it tries."""

from __future__ import annotations

import math

import pytest

from opacus_lastiterate.analysis.calibration import calibrate_noise_multiplier
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    AdaptiveSettings,
    adaptive_weights,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

T, Q, DELTA, TARGET, SCALE = 60, 0.05, 1e-5, 1.0, 0.01  # SCALE = C / B
WARMUP = 6
RATES = [1e-3 * min((k + 1) / WARMUP, (T - k) / (T - WARMUP)) for k in range(T)]
SETTINGS = [
    AdaptiveSettings("adamw", lr=lr, beta1=0.9, beta2=0.999, eps=1e-3, weight_decay=20.0)
    for lr in RATES
]


def _from_scratch(sigma: float) -> float:
    weights = adaptive_weights(SETTINGS, noise_std=sigma * SCALE)
    run = DPSGDRun.from_history([(sigma, Q, T)], weights=weights)
    return privacy_model("heuristic", run).epsilon(DELTA)


@pytest.fixture(scope="module")
def calibrated() -> float:
    return calibrate_noise_multiplier(
        TARGET, DELTA, steps=T, sample_rate=Q, optimizer_settings=SETTINGS, noise_scale=SCALE
    )


def test_the_calibrated_sigma_meets_the_target_on_the_adaptive_heuristic(
    calibrated: float,
) -> None:
    assert _from_scratch(calibrated) == pytest.approx(TARGET, rel=3e-3)
    # it is another sigma than the constant-rate calibration's: the weights were used
    plain = calibrate_noise_multiplier(TARGET, DELTA, steps=T, sample_rate=Q)
    assert abs(plain - calibrated) > 0.02 * calibrated


@pytest.mark.slow
def test_a_bisection_on_the_from_scratch_model_agrees(calibrated: float) -> None:
    lo, hi = math.log(0.25), math.log(16.0)
    assert _from_scratch(math.exp(lo)) > TARGET > _from_scratch(math.exp(hi))
    while hi - lo > 1e-3:  # sigma to 0.1 %
        mid = 0.5 * (lo + hi)
        if _from_scratch(math.exp(mid)) > TARGET:
            lo = mid
        else:
            hi = mid
    assert calibrated == pytest.approx(math.exp(hi), rel=3e-3)


def test_a_single_settings_is_every_step() -> None:
    one = AdaptiveSettings("adamw", lr=1e-3, weight_decay=0.01)
    got = calibrate_noise_multiplier(
        TARGET, DELTA, steps=T, sample_rate=Q, optimizer_settings=one, noise_scale=SCALE
    )
    same = calibrate_noise_multiplier(
        TARGET, DELTA, steps=T, sample_rate=Q, optimizer_settings=[one] * T, noise_scale=SCALE
    )
    assert got == same


@pytest.mark.parametrize("kwargs, error, match", [
    ({"optimizer_settings": SETTINGS[:-1]}, ValueError, "optimizer_settings"),
    ({"optimizer_settings": SETTINGS, "accountant": "standard"}, ValueError, "optimizer_settings"),
    ({"optimizer_settings": SETTINGS, "noise_scale": 0.0}, ValueError, "noise_scale"),
    ({"optimizer_settings": "adamw"}, TypeError, "optimizer_settings"),
])
def test_bad_adaptive_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        calibrate_noise_multiplier(TARGET, DELTA, steps=T, sample_rate=Q, **kwargs)


@pytest.mark.slow
def test_adam_l2_decay_weights_are_recomputed_at_each_sigma() -> None:
    settings = [AdaptiveSettings("adam", lr=lr, eps=1e-3, weight_decay=0.5) for lr in RATES]

    def from_scratch(sigma: float, weights_at: float) -> float:
        weights = adaptive_weights(settings, noise_std=weights_at * SCALE)
        run = DPSGDRun.from_history([(sigma, Q, T)], weights=weights)
        return privacy_model("heuristic", run).epsilon(DELTA)

    sigma = calibrate_noise_multiplier(
        TARGET, DELTA, steps=T, sample_rate=Q, optimizer_settings=settings, noise_scale=SCALE
    )
    assert from_scratch(sigma, sigma) == pytest.approx(TARGET, rel=3e-3)
    assert abs(from_scratch(sigma, 1.0) - TARGET) > 1e-2  # the weights of another sigma
