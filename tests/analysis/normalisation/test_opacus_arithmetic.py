"""Opacus 1.x's (sample rate, divisor) against Opacus's own objects.

The analysis module never imports opacus; these tests do, and compare its arithmetic with
what ``DPDataLoader`` and ``PrivacyEngine.make_private`` really compute.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus import PrivacyEngine
from opacus.data_loader import DPDataLoader
from torch.utils.data import DataLoader, Dataset

from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic


class _Sized(Dataset):
    """A data set of N one-feature rows, without materialising them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.zeros(1), torch.zeros(())


def _opacus_loader_values(n: int, batch_size: int, drop_last: bool = False):
    """(len(loader), sampler rate, len(DPDataLoader), make_private's q and divisor)."""
    loader = DataLoader(_Sized(n), batch_size=batch_size, drop_last=drop_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = DPDataLoader.from_data_loader(loader)
    q = 1 / len(dp)  # privacy_engine.py:440 (1.6.0)
    return len(loader), dp.sample_rate, len(dp), q, int(len(dp.dataset) * q)  # :441


def _make_private_values(n: int, batch_size: int):
    """The real thing: make_private on a one-parameter model."""
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, opt, dl = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            data_loader=DataLoader(_Sized(n), batch_size=batch_size),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    return dl.sample_rate, len(dl), opt.expected_batch_size


def _ours(n: int, batch_size: int, drop_last: bool = False):
    a = opacus1x_batch_arithmetic(n, batch_size, drop_last=drop_last)
    return (
        a.loader_length,
        a.sampler_rate,
        a.steps_per_epoch,
        a.accountant_rate,
        a.expected_batch_size,
    )


# (N, L, expected divisor): the float artefacts in docs/normalisation.md, "Opacus's divisor
# arithmetic"
KNOWN = [
    (60000, 256, 255),
    (50000, 250, 250),
    (49999, 250, 249),
    (147, 3, 2),
    (9300, 100, 101),
    (49, 1, 0),
    (200, 30, 28),
]


@pytest.mark.parametrize(("n", "batch_size", "divisor"), KNOWN)
def test_known_configurations_match_make_private(n: int, batch_size: int, divisor: int) -> None:
    ours = opacus1x_batch_arithmetic(n, batch_size)
    sampler_rate, steps, ebs = _make_private_values(n, batch_size)
    assert ours.expected_batch_size == ebs == divisor
    assert ours.sampler_rate == sampler_rate
    assert ours.steps_per_epoch == steps


def test_accountant_rate_above_sampler_rate_for_k_93() -> None:
    a = opacus1x_batch_arithmetic(9300, 100)
    assert a.loader_length == 93 and a.steps_per_epoch == 92
    assert a.accountant_rate == 1 / 92 > a.sampler_rate == 1 / 93
    assert a.expected_batch_size > a.batch_size


@pytest.mark.parametrize("batch_size", [1, 3, 7, 64, 100, 256])
def test_sweep_matches_dp_data_loader(batch_size: int) -> None:
    for n in range(max(2, batch_size - 3), batch_size * 120, max(1, batch_size // 3)):
        assert _ours(n, batch_size) == _opacus_loader_values(n, batch_size), n


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=2_000_000),
    batch_size=st.integers(min_value=1, max_value=5000),
    drop_last=st.booleans(),
)
def test_property_matches_dp_data_loader(n: int, batch_size: int, drop_last: bool) -> None:
    if drop_last and n < batch_size:
        with pytest.raises(ValueError, match="batch_size"):
            opacus1x_batch_arithmetic(n, batch_size, drop_last=True)
        return
    assert _ours(n, batch_size, drop_last) == _opacus_loader_values(n, batch_size, drop_last)


def test_textbook_formula_is_wrong_somewhere() -> None:
    textbook = 147 // -(-147 // 3)  # floor(N / ceil(N / L))
    assert textbook == 3 and opacus1x_batch_arithmetic(147, 3).expected_batch_size == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(dataset_size=0, batch_size=1), ValueError, "dataset_size"),
        (dict(dataset_size=10, batch_size=0), ValueError, "batch_size"),
        (dict(dataset_size=10.0, batch_size=2), TypeError, "dataset_size"),
        (dict(dataset_size=10, batch_size=2, drop_last=1), TypeError, "drop_last"),
    ],
)
def test_validation(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        opacus1x_batch_arithmetic(**kwargs)
