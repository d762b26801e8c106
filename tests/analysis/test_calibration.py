"""calibrate_noise_multiplier: the returned sigma meets the target, and a sigma 2 rtol
smaller does not (the defining property, checked with the models themselves)."""

from __future__ import annotations

import math

import pytest

from opacus_lastiterate.analysis import (
    calibrate_noise_multiplier,
    full_batch_epsilon,
    gaussian_epsilon,
    standard_epsilon,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

DELTA = 1e-5


def _epsilon(accountant: str, sigma: float, steps: int, q: float) -> float:
    kw = {"steps": steps, "sample_rate": q, "noise_multiplier": sigma}
    if accountant == "heuristic":
        return privacy_model("heuristic", DPSGDRun.constant(**kw)).epsilon(DELTA)
    if accountant == "robust_heuristic":
        return privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(DELTA)
    if accountant == "standard":
        return standard_epsilon(DELTA, value_discretization_interval=1e-3, **kw)
    return full_batch_epsilon(DELTA, **kw)


@pytest.mark.parametrize(
    ("accountant", "steps", "q", "target"),
    [
        ("heuristic", 1000, 0.01, 2.0),
        ("heuristic", 3, 0.1, 0.5),
        ("robust_heuristic", 50, 0.01, 1.0),  # non-monotone regime: robust > plain
        ("standard", 20, 0.05, 3.0),
        ("standard", 1, 0.5, 2.0),
        ("full_batch", 100, 0.02, 1.5),
    ],
)
def test_sigma_is_the_smallest_that_meets_the_target(accountant, steps, q, target) -> None:
    rtol = 1e-3
    sigma = calibrate_noise_multiplier(
        target, DELTA, steps=steps, sample_rate=q, accountant=accountant,
        value_discretization_interval=1e-3, rtol=rtol,
    )
    assert _epsilon(accountant, sigma, steps, q) <= target
    assert _epsilon(accountant, sigma / (1 + 2 * rtol), steps, q) > target


def test_full_batch_matches_the_closed_form() -> None:
    # full batch is mu-GDP with mu = q sqrt(T) / sigma: invert with the Gaussian mechanism
    steps, q, target = 400, 0.02, 1.0
    sigma = calibrate_noise_multiplier(
        target, DELTA, steps=steps, sample_rate=q, accountant="full_batch", rtol=1e-6
    )
    mu = q * math.sqrt(steps) / sigma
    assert gaussian_epsilon(mu=mu, delta=DELTA) == pytest.approx(target, rel=1e-5)


def test_ordering_of_the_accountants() -> None:
    # robust >= heuristic and standard >= heuristic at every sigma: their sigmas are larger
    kw = {"steps": 30, "sample_rate": 0.01}
    sigmas = {
        a: calibrate_noise_multiplier(
            1.0, DELTA, accountant=a, rtol=1e-4, value_discretization_interval=1e-3, **kw  # type: ignore[arg-type]
        )
        for a in ("heuristic", "robust_heuristic", "standard")
    }
    assert sigmas["robust_heuristic"] >= sigmas["heuristic"] * (1 - 1e-4)
    assert sigmas["standard"] >= sigmas["heuristic"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"target_epsilon": 0.0}, "target_epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"steps": 0}, "steps"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"accountant": "prv"}, "accountant"),
        ({"rtol": 0.5}, "rtol"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, match) -> None:
    args = {"target_epsilon": 1.0, "delta": DELTA, "steps": 10, "sample_rate": 0.1,
            "accountant": "heuristic", "rtol": 1e-3}
    args.update(kwargs)
    target, delta = args.pop("target_epsilon"), args.pop("delta")
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(target, delta, **args)  # type: ignore[arg-type]


def test_accountant_must_be_a_registry_name() -> None:
    kw = {"steps": 30, "sample_rate": 0.05, "rtol": 1e-3}
    with pytest.raises(ValueError, match="`accountant` must be one of"):
        calibrate_noise_multiplier(2.0, DELTA, accountant="robust", **kw)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="accountant"):
        calibrate_noise_multiplier(2.0, DELTA, accountant=3, **kw)  # type: ignore[arg-type]
