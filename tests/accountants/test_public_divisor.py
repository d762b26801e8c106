"""The fix: ``use_public_divisor`` makes the divisor of an Opacus 1.x DPOptimizer independent of N.

Real ``make_private`` runs with N - 1, N, N + 1 around a data set size for which Opacus's
``expected_batch_size = int(N / len(DPDataLoader))`` changes (``docs/normalisation.md``,
"FEASGM / EASGM with a data-dependent divisor"): the same batch, the same initial weights
and the same noise draws give different ``p.grad`` without the fix and identical ones with
it.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.accountants import (
    FEASGMAccountant,
    public_divisor_of,
    use_public_divisor,
)
from opacus_lastiterate.analysis.baselines.composition import (
    StandardComposition,
)
from opacus_lastiterate.analysis.normalisation import unsafe_dataset_sizes
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

BATCH = 8
DIVISOR = 8


def _unsafe_n() -> int:
    """The first N whose divisor changes among N - 1, N, N + 1 while the sample rate does not
    (so that the fix alone makes the configuration safe)."""
    for n in unsafe_dataset_sizes(BATCH, start=BATCH + 2, stop=200):
        rows = [opacus1x_batch_arithmetic(m, BATCH) for m in (n - 1, n, n + 1)]
        if (
            len({r.sampler_rate for r in rows}) == 1
            and len({r.expected_batch_size for r in rows}) > 1
        ):
            return n
    raise AssertionError("no such N")  # pragma: no cover


N = _unsafe_n()


def _private(n: int, accountant: str = "rdp") -> tuple[nn.Module, object, PrivacyEngine]:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    dataset = TensorDataset(torch.randn(n, 3), torch.randint(0, 2, (n,)))
    engine = PrivacyEngine(accountant=accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, _ = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=DataLoader(dataset, batch_size=BATCH),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
            noise_generator=torch.Generator().manual_seed(1),
        )
    return model, optimizer, engine


def _released_grad(model: nn.Module, optimizer: object) -> torch.Tensor:
    """p.grad after one step on a fixed batch (same weights and noise in every run)."""
    x = torch.linspace(-1, 1, 15).reshape(5, 3)
    y = torch.tensor([0, 1, 0, 1, 1])
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(model(x), y).backward()
    optimizer.step()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_without_the_fix_the_divisor_and_the_update_change_with_n() -> None:
    grads, divisors = [], []
    for n in (N - 1, N, N + 1):
        model, optimizer, _ = _private(n)
        assert (
            optimizer.expected_batch_size == opacus1x_batch_arithmetic(n, BATCH).expected_batch_size
        )
        divisors.append(optimizer.expected_batch_size)
        grads.append(_released_grad(model, optimizer))
    assert len(set(divisors)) > 1
    assert any(not torch.equal(grads[0], g) for g in grads[1:])
    # the update is the same noisy sum divided by the N-dependent divisor
    for g, c in zip(grads, divisors):
        torch.testing.assert_close(g * c, grads[0] * divisors[0])


def test_with_the_fix_the_update_is_identical_for_n_minus_1_n_n_plus_1() -> None:
    grads = []
    for n in (N - 1, N, N + 1):
        model, optimizer, _ = _private(n)
        assert use_public_divisor(optimizer, expected_batch_size=DIVISOR) is optimizer
        assert optimizer.expected_batch_size == DIVISOR
        assert public_divisor_of(optimizer) == DIVISOR
        grads.append(_released_grad(model, optimizer))
    assert all(torch.equal(grads[0], g) for g in grads[1:])


def test_the_feasgm_accountant_picks_up_the_fix_and_gives_the_sgm_epsilon() -> None:
    model, optimizer, engine = _private(N, accountant="feasgm")
    acc = engine.accountant
    assert isinstance(acc, FEASGMAccountant)
    acc.configure(dataset_size=N, batch_size=BATCH)
    _released_grad(model, optimizer)
    assert not acc.verdict.safe and math.isinf(acc.get_epsilon(1e-5))  # Opacus's divisor

    model, optimizer, engine = _private(N, accountant="feasgm")
    use_public_divisor(optimizer, expected_batch_size=DIVISOR)
    acc = engine.accountant.configure(dataset_size=N, batch_size=BATCH)
    _released_grad(model, optimizer)
    assert acc.configuration["public_divisor"] == DIVISOR
    assert acc.verdict.safe and acc.verdict.divisors == (DIVISOR,) * 3
    assert acc.get_epsilon(1e-5) == pytest.approx(
        StandardComposition(acc.history).epsilon(1e-5), rel=1e-12
    )


def test_a_divisor_changed_after_the_fix_is_no_longer_public() -> None:
    _, optimizer, _ = _private(N)
    assert public_divisor_of(optimizer) is None
    use_public_divisor(optimizer, expected_batch_size=12.5)
    assert optimizer.expected_batch_size == 12.5 and public_divisor_of(optimizer) == 12.5
    optimizer.expected_batch_size = 7
    assert public_divisor_of(optimizer) is None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-3, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("8", TypeError),
    ],
)
def test_bad_divisors_are_rejected_and_leave_the_optimizer_unchanged(
    value: object, error: type
) -> None:
    _, optimizer, _ = _private(N)
    before = optimizer.expected_batch_size
    with pytest.raises(error, match="expected_batch_size"):
        use_public_divisor(optimizer, expected_batch_size=value)  # type: ignore[arg-type]
    assert optimizer.expected_batch_size == before and public_divisor_of(optimizer) is None


def test_only_dp_optimizers_with_mean_reduction_are_accepted() -> None:
    with pytest.raises(TypeError, match="optimizer"):
        use_public_divisor(
            torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), expected_batch_size=8
        )  # type: ignore[arg-type]
    _, optimizer, _ = _private(N)
    optimizer.loss_reduction = "sum"
    with pytest.raises(ValueError, match="loss_reduction"):
        use_public_divisor(optimizer, expected_batch_size=8)
