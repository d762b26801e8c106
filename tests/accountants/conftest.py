"""Shared fixtures for the Opacus integration tests: digits data and a tiny model."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers "last_iterate")

BATCH_SIZE = 64


@pytest.fixture(scope="session")
def digits_dataset() -> TensorDataset:
    """scikit-learn's bundled 8x8 digits (1797 examples, no download), standardised."""
    x, y = load_digits(return_X_y=True)
    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
    return TensorDataset(torch.as_tensor(x.astype(np.float32)), torch.as_tensor(y.astype(np.int64)))


@pytest.fixture
def make_setup(
    digits_dataset: TensorDataset,
) -> Callable[[], tuple[nn.Module, torch.optim.Optimizer, DataLoader]]:
    """Factory of a fresh (seeded) MLP, SGD optimizer and data loader."""

    def make() -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(digits_dataset, batch_size=BATCH_SIZE)
        return model, optimizer, loader

    return make


def train_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, steps: int
) -> int:
    """Run ``steps`` optimizer steps over (Poisson) batches; return how many were taken."""
    criterion = nn.CrossEntropyLoss()
    taken = 0
    while taken < steps:
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            taken += 1
            if taken == steps:
                break
    return taken


@pytest.fixture
def train() -> Callable[[nn.Module, torch.optim.Optimizer, DataLoader, int], int]:
    """The :func:`train_steps` helper, as a fixture."""
    return train_steps
