"""Warnings raised inside Opacus (optimizer hooks, noise calibration) point at the user's line.

Each warning below is raised several frames deep in opacus_lastiterate, Opacus and torch;
``opacus_lastiterate._warn.warn`` attributes it to the first frame outside them: this file.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.exceptions import (
    HeuristicCalibrationWarning,
    NormalisationWarning,
    OptimizerTraceWarning,
)

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


def _private(
    digits_dataset: TensorDataset, accountant: str, optimizer_cls: Any = torch.optim.SGD
) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    optimizer = optimizer_cls(model.parameters(), lr=0.01)
    loader = DataLoader(digits_dataset, batch_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PrivacyEngine(accountant=accountant).make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )


def _step_and_record(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader,
                     category: type[Warning]) -> tuple[list[warnings.WarningMessage], int]:
    x, y = next(iter(loader))
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    with pytest.warns(category) as record:
        line = sys._getframe().f_lineno + 1
        optimizer.step()  # DPOptimizer.step -> torch -> accountant hook -> warn
    return [w for w in record if issubclass(w.category, category)], line


def test_optimizer_trace_warning_points_at_optimizer_step(digits_dataset: TensorDataset) -> None:
    model, optimizer, loader = _private(digits_dataset, "last_iterate", torch.optim.Rprop)
    record, line = _step_and_record(model, optimizer, loader, OptimizerTraceWarning)
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)]


def test_normalisation_warning_points_at_optimizer_step(digits_dataset: TensorDataset) -> None:
    model, optimizer, loader = _private(digits_dataset, "asgm")
    record, line = _step_and_record(model, optimizer, loader, NormalisationWarning)
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)]


def test_calibration_warning_points_at_make_private_with_epsilon(
    digits_dataset: TensorDataset,
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(64, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(digits_dataset, batch_size=64)
    engine = PrivacyEngine(accountant="last_iterate")
    with pytest.warns(HeuristicCalibrationWarning) as record:
        line = sys._getframe().f_lineno + 1
        engine.make_private_with_epsilon(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            target_epsilon=2.0,
            target_delta=1e-5,
            epochs=1,
            max_grad_norm=1.0,
        )
    calibration = [w for w in record if issubclass(w.category, HeuristicCalibrationWarning)]
    assert [(w.filename, w.lineno) for w in calibration] == [(__file__, line)]
