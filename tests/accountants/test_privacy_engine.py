"""End-to-end: tiny real DP-SGD runs on digits with PrivacyEngine(accountant="last_iterate")."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn

from opacus_lastiterate.accountants import HeuristicCalibrationWarning, LastIterateAccountant
from opacus_lastiterate.analysis.baselines import composition
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

DELTA = 1e-5
SIGMA = 1.1
Setup = Callable[[], tuple[nn.Module, torch.optim.Optimizer, Any]]
Train = Callable[..., int]


def _private(
    engine: PrivacyEngine, make_setup: Setup, sigma: float = SIGMA
) -> tuple[Any, Any, Any, float]:
    model, optimizer, loader = make_setup()
    q = 1 / len(loader)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=sigma,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )
    return model, optimizer, loader, q


def test_training_records_steps_and_reports_the_heuristic(make_setup: Setup, train: Train) -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader, q = _private(engine, make_setup)
    steps = train(model, optimizer, loader, 6)

    acc = engine.accountant
    assert isinstance(acc, LastIterateAccountant)
    assert acc.history == [(SIGMA, q, steps)]
    assert acc.num_steps == steps == 6 and len(acc) == 1
    eps = engine.get_epsilon(DELTA)
    assert eps == pytest.approx(
        privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=SIGMA)).epsilon(DELTA),
        rel=1e-12,
    )
    standard = composition.standard_epsilon(
        DELTA, steps=steps, sample_rate=q, noise_multiplier=SIGMA
    )
    assert 0.0 < eps < standard


def test_explicit_accountant_assignment_works_without_registration(
    make_setup: Setup, train: Train
) -> None:
    engine = PrivacyEngine(accountant="rdp")
    engine.accountant = LastIterateAccountant()  # documented route for any Opacus 1.x
    model, optimizer, loader, q = _private(engine, make_setup, sigma=0.9)
    train(model, optimizer, loader, 3)
    assert engine.accountant.history == [(0.9, q, 3)]
    assert engine.get_epsilon(DELTA) == engine.accountant.get_epsilon(DELTA) > 0.0


def test_make_private_with_epsilon_calibrates_to_the_robust_heuristic_when_asked(
    make_setup: Setup, train: Train
) -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = make_setup()
    q = 1 / len(loader)
    target, epochs = 2.0, 1
    with pytest.warns(HeuristicCalibrationWarning, match="not a differential-privacy guarantee"):
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            target_epsilon=target,
            target_delta=DELTA,
            epochs=epochs,
            max_grad_norm=1.0,
            robust=True,  # Opacus forwards it to get_epsilon
        )
    sigma = optimizer.noise_multiplier
    steps = int(epochs / q)  # what Opacus's get_noise_multiplier uses
    robust = max(  # every suffix length, brute force
        privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(DELTA)
        for t in range(1, steps + 1)
    )
    assert target - 0.01 <= robust <= target * (1 + 1e-6)  # Opacus's epsilon_tolerance
    standard = composition.standard_epsilon(
        DELTA, steps=steps, sample_rate=q, noise_multiplier=sigma
    )
    assert standard > target

    # The engine's own accountant starts empty and records real steps without warning.
    assert engine.accountant.history == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeuristicCalibrationWarning)
        train(model, optimizer, loader, 2)
        assert engine.accountant.history == [(sigma, q, 2)]
        assert engine.get_epsilon(DELTA) > 0.0


def test_checkpoint_round_trip_restores_history(
    make_setup: Setup, train: Train, tmp_path: Path
) -> None:
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader, q = _private(engine, make_setup)
    train(model, optimizer, loader, 4)
    path = tmp_path / "checkpoint.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=optimizer)

    fresh = PrivacyEngine(accountant="last_iterate")
    model2, optimizer2, loader2, _ = _private(fresh, make_setup)
    assert fresh.accountant.history == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeuristicCalibrationWarning)
        fresh.load_checkpoint(path=path, module=model2, optimizer=optimizer2)
        assert fresh.accountant.history == engine.accountant.history == [(SIGMA, q, 4)]
        assert fresh.get_epsilon(DELTA) == engine.get_epsilon(DELTA)
        for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
            assert torch.equal(p, p2)
        train(model2, optimizer2, loader2, 1)  # training continues the same segment
    assert fresh.accountant.history == [(SIGMA, q, 5)]


def test_checkpoint_of_an_rdp_engine_is_rejected(
    make_setup: Setup, train: Train, tmp_path: Path
) -> None:
    rdp_engine = PrivacyEngine(accountant="rdp")
    model, optimizer, loader, _ = _private(rdp_engine, make_setup)
    train(model, optimizer, loader, 2)
    path = tmp_path / "rdp.pt"
    rdp_engine.save_checkpoint(path=path, module=model, optimizer=optimizer)

    engine = PrivacyEngine(accountant="last_iterate")
    model2, optimizer2, loader2, q = _private(engine, make_setup)
    train(model2, optimizer2, loader2, 1)
    with pytest.raises(ValueError, match="rdp"):
        engine.load_checkpoint(path=path, module=model2, optimizer=optimizer2)
    assert engine.accountant.history == [(SIGMA, q, 1)]
