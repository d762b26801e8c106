"""``PrivacyEngine(accountant="last_iterate").make_private_with_epsilon`` with AdamW: the noise
multiplier meets the target on the adaptive heuristic ("heuristic; adaptive second moment
treated as fixed") of the planned run, checked against the from-scratch weighted heuristic
with weights from ``adaptive_weights`` (the settings read from the optimizer given, assumed for
every step; or the per-step ``optimizer_settings=``, a warm-up and decay schedule), within
Opacus's bisection tolerance (``epsilon_tolerance`` = 0.01 below the target, never above);
bad plans are refused before anything is trained."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers "last_iterate")
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    AdaptiveSettings,
    adaptive_weights,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

N, BATCH, EPOCHS, CLIP, DELTA, TARGET = 256, 32, 5, 2.0, 1e-5, 2.0
STEPS = EPOCHS * N // BATCH  # 40
Q = BATCH / N
WARMUP = 4
RATES = [1e-3 * min((k + 1) / WARMUP, (STEPS - k) / (STEPS - WARMUP)) for k in range(STEPS)]

pytestmark = pytest.mark.filterwarnings(
    "ignore::opacus_lastiterate.exceptions.HeuristicCalibrationWarning",
    "ignore::opacus_lastiterate.exceptions.AdaptiveHeuristicWarning",
    "ignore:Secure RNG turned off:UserWarning",
    "ignore:Optimal order:UserWarning",
)


def _calibrate(optimizer_cls: Any = torch.optim.AdamW, **kwargs: Any) -> float:
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(N, 16), torch.randint(0, 4, (N,)))
    model = nn.Linear(16, 4)
    optimizer = optimizer_cls(model.parameters(), lr=1e-3, weight_decay=0.01)
    engine = PrivacyEngine(accountant=kwargs.pop("accountant", "last_iterate"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        _, dp_optimizer, _ = engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=BATCH),
            target_epsilon=TARGET, target_delta=DELTA, epochs=EPOCHS, max_grad_norm=CLIP,
            **kwargs,
        )
    return float(dp_optimizer.noise_multiplier)


def _from_scratch(sigma: float, settings: list[AdaptiveSettings] | None) -> float:
    weights = None
    if settings is not None:
        weights = adaptive_weights(settings, noise_std=sigma * CLIP / BATCH)
    run = DPSGDRun.from_history([(sigma, Q, STEPS)], weights=weights)
    return privacy_model("heuristic", run).epsilon(DELTA)


def test_adamw_read_from_the_optimizer_is_calibrated_on_its_weights() -> None:
    sigma = _calibrate()
    settings = [AdaptiveSettings("adamw", lr=1e-3, weight_decay=0.01)] * STEPS
    assert TARGET - 0.02 <= _from_scratch(sigma, settings) <= TARGET * (1 + 2e-3)


def test_a_planned_schedule_is_calibrated_and_differs_from_constant_rate() -> None:
    settings = [AdaptiveSettings("adamw", lr=lr, weight_decay=0.01) for lr in RATES]
    sigma = _calibrate(optimizer_settings=settings)
    assert TARGET - 0.02 <= _from_scratch(sigma, settings) <= TARGET * (1 + 2e-3)
    # the constant-rate formula at that sigma misses the target: the weights were used
    assert abs(_from_scratch(sigma, None) - TARGET) > 0.1
    # SGD is calibrated on the constant-rate formula, as before
    plain = _calibrate(torch.optim.SGD)
    assert TARGET - 0.02 <= _from_scratch(plain, None) <= TARGET


@pytest.mark.parametrize("kwargs, match", [
    ({"optimizer_settings": [AdaptiveSettings("adamw", lr=1e-3)] * (STEPS - 1)},
     "optimizer_settings"),
    ({"optimizer_settings": "adamw"}, "optimizer_settings"),
    ({"optimizer_settings": AdaptiveSettings("adamw", lr=1e-3), "accountant": "rdp"},
     "optimizer_settings"),
])
def test_bad_plans_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        _calibrate(**kwargs)


def test_an_accountant_created_under_a_plan_answers_an_assigned_history_with_it() -> None:
    """What Opacus's get_noise_multiplier does inside the call: a fresh accountant, a history
    assigned, get_epsilon; the answer is the from-scratch adaptive heuristic, so labelled."""
    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.accountants.adaptive_plan import (
        AdaptivePlan,
        adaptive_plan_of_new_accountants,
    )

    settings = [AdaptiveSettings("adamw", lr=lr, weight_decay=0.01) for lr in RATES]
    with adaptive_plan_of_new_accountants(AdaptivePlan(tuple(settings), CLIP / BATCH)):
        planned = LastIterateAccountant()
    plain = LastIterateAccountant()  # outside the block: no plan
    for acc in (planned, plain):
        acc.history = [(1.5, Q, STEPS)]
    assert planned.adaptive_optimizer == "adamw" and plain.adaptive_optimizer is None
    assert planned.heuristic_label == "heuristic; adaptive second moment treated as fixed"
    assert planned.get_epsilon(DELTA) == pytest.approx(_from_scratch(1.5, settings), rel=2e-3)
    assert plain.get_epsilon(DELTA) == pytest.approx(_from_scratch(1.5, None), rel=1e-9)
    # a history the plan does not cover (another length) falls back to the constant rate
    planned.history = [(1.5, Q, STEPS + 1)]
    assert planned.adaptive_optimizer is None


def test_an_optimizer_whose_groups_differ_needs_optimizer_settings() -> None:
    from opacus_lastiterate.accountants.adaptive_plan import plan_for_calibration

    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    optimizer = torch.optim.AdamW([{"params": a.parameters()},
                                   {"params": b.parameters(), "lr": 0.1}], lr=1e-3)
    loader = DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=BATCH)
    with pytest.raises(ValueError, match="optimizer_settings"):
        plan_for_calibration(optimizer=optimizer, optimizer_settings=None, data_loader=loader,
                             max_grad_norm=1.0, steps=10)
    plan = plan_for_calibration(optimizer=optimizer, optimizer_settings=AdaptiveSettings(
        "adamw", lr=1e-3), data_loader=loader, max_grad_norm=[3.0, 4.0], steps=10)
    assert plan is not None and plan.noise_scale == pytest.approx(5.0 / BATCH)
    sgd = torch.optim.SGD(a.parameters(), lr=0.1)
    assert plan_for_calibration(optimizer=sgd, optimizer_settings=None, data_loader=loader,
                                max_grad_norm=1.0, steps=10) is None


def test_the_calibration_warning_names_the_adaptive_heuristic() -> None:
    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.accountants.adaptive_plan import (
        AdaptivePlan,
        adaptive_plan_of_new_accountants,
    )
    from opacus_lastiterate.exceptions import HeuristicCalibrationWarning

    with adaptive_plan_of_new_accountants(AdaptivePlan(AdaptiveSettings("adam", lr=1e-3), 0.1)):
        acc = LastIterateAccountant()
    acc.history = [(1.0, Q, STEPS)]
    with pytest.warns(HeuristicCalibrationWarning, match="adaptive second moment treated as fixed"):
        acc.get_epsilon(DELTA)
