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
