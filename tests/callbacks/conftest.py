"""A tiny DP-SGD set-up (random data, a two-layer MLP) for the monitor tests."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers "last_iterate")

DELTA = 1e-5
N, BATCH = 256, 32  # q = 1/8
# Tests that train on a device run on the CPU everywhere and on CUDA where a GPU is present.
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


def make_dp(
    *,
    accountant: str = "last_iterate",
    sigma: float = 1.0,
    lr: float = 0.1,
    momentum: float = 0.0,
    seed: int = 0,
) -> tuple[Any, nn.Module, Any, DataLoader]:
    """(engine, model, DPOptimizer, DPDataLoader) for random 16-feature, 4-class data."""
    from opacus import PrivacyEngine

    torch.manual_seed(seed)
    x, y = torch.randn(N, 16), torch.randint(0, 4, (N,))
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    engine = PrivacyEngine(accountant=accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH),
            noise_multiplier=sigma,
            max_grad_norm=1.0,
        )
    return engine, model, optimizer, loader


def train(model: nn.Module, optimizer: Any, loader: DataLoader, steps: int, after=None) -> int:
    """Up to ``steps`` optimizer steps (cycling the loader); ``after(step)`` after each."""
    done = 0
    while done < steps:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            done += 1
            if after is not None:
                after(done)
            if done == steps:
                break
    return done


@pytest.fixture
def dp_setup() -> Callable[..., tuple[Any, nn.Module, Any, DataLoader]]:
    return make_dp


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        yield
