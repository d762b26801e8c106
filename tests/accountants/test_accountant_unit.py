"""The privacy unit stated on the LastIterateAccountant: its numbers are those of the unit
(against the enumeration and dp_accounting references of tests/analysis/test_user_level.py),
its state carries the unit and refuses to load into an accountant of another unit, and
make_private_with_epsilon calibrates for it."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy import stats
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.unit_setting import unit_of_new_accountants
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from tests.analysis.test_user_level import (
    DELTA,
    _cosine_momentum,
    _exact_epsilon,
    _poisson_law,
)

STEPS, Q, SIGMA = 4, 0.3, 0.7


def _stepped(unit: PrivacyUnit | None, steps: int = STEPS) -> LastIterateAccountant:
    acc = LastIterateAccountant(unit=unit)
    for _ in range(steps):
        acc.step(noise_multiplier=SIGMA, sample_rate=Q)
    return acc


@pytest.mark.parametrize("unit", [PrivacyUnit.user(2), PrivacyUnit.group(2), PrivacyUnit.user(3)])
def test_get_epsilon_is_the_units_number_by_enumeration(unit: PrivacyUnit) -> None:
    exact = _exact_epsilon(
        _poisson_law(np.ones(STEPS), Q, unit.max_records), SIGMA * math.sqrt(STEPS)
    )
    acc = _stepped(unit)
    assert acc.get_epsilon(DELTA) == pytest.approx(exact, rel=1e-8)
    assert acc.get_epsilon(DELTA) > 1.5 * _stepped(None).get_epsilon(DELTA)
    assert acc.unit == unit and "records" in acc.describe(DELTA)


def test_the_standard_number_is_the_units_mixture_of_gaussians() -> None:
    k, interval = 2, 1e-2
    acc = _stepped(PrivacyUnit.user(k), steps=10)
    theirs = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval
    )
    counts = np.arange(k + 1)
    event = dp_event.MixtureOfGaussiansDpEvent(
        SIGMA, counts.astype(float).tolist(), stats.binom.pmf(counts, k, Q).tolist()
    )
    theirs.compose(dp_event.SelfComposedDpEvent(event, 10))
    ours = acc.kept_model.epsilon(DELTA, "standard", value_discretization_interval=interval)
    assert ours == pytest.approx(theirs.get_epsilon(DELTA), rel=1e-6)


def test_weighted_steps_give_the_units_weighted_number() -> None:
    k = 2
    lrs = 0.5 * (1 + np.cos(np.pi * np.arange(STEPS) / STEPS)) + 0.05
    w = _cosine_momentum(STEPS)  # torch's SGD weights of these rates with momentum 0.9
    w = w / w.max()
    exact = _exact_epsilon(_poisson_law(w, Q, k), SIGMA * math.sqrt(float(np.sum(w * w))))
    acc = LastIterateAccountant(unit=PrivacyUnit.user(k))
    for lr in lrs:
        acc.replay_step(SIGMA, Q, SGDSettings(float(lr), 0.9, 0.0, False, 0.0))
    assert acc.uses_weights
    assert exact * (1 - 1e-9) <= acc.get_epsilon(DELTA) <= exact * (1 + 1e-3)
    with pytest.raises(ValueError, match="unit"):
        acc.weighted_result(DELTA)  # the kept engine is one record's


def test_setting_the_unit_changes_the_number_and_keeps_the_steps() -> None:
    acc = _stepped(None)
    record = acc.get_epsilon(DELTA)
    acc.unit = PrivacyUnit.user(2)
    assert acc.get_epsilon(DELTA) > record and acc.num_steps == STEPS
    assert acc.replay_steps(SIGMA, Q, None, 4, delta=DELTA) is None  # no batch solve
    acc.unit = None
    assert acc.unit == PrivacyUnit.record() and acc.get_epsilon(DELTA) == record
    with pytest.raises(TypeError, match="`unit`"):
        acc.unit = 2  # type: ignore[assignment]
    with pytest.raises(TypeError, match="`unit`"):
        LastIterateAccountant(unit="user(2)")  # type: ignore[arg-type]
    assert acc.unit == PrivacyUnit.record()


def test_robust_has_no_model_for_a_user() -> None:
    with pytest.raises(ValueError, match="`unit`"):
        _stepped(PrivacyUnit.user(2)).get_epsilon(DELTA, robust=True)


def test_state_keeps_the_unit_and_refuses_another() -> None:
    user = _stepped(PrivacyUnit.user(3))
    state = user.state_dict()
    assert state["privacy_unit"] == {"kind": "user", "max_records": 3}
    assert "privacy_unit" not in _stepped(None).state_dict()  # one record: as before
    twin = LastIterateAccountant(unit=PrivacyUnit.user(3))
    twin.load_state_dict(state)
    assert twin.get_epsilon(DELTA) == user.get_epsilon(DELTA)
    user.take_back(1)
    assert user.num_steps == STEPS - 1 and user.unit == PrivacyUnit.user(3)
    for other in (None, PrivacyUnit.group(3), PrivacyUnit.user(2)):
        acc = _stepped(other, steps=2)
        before = acc.state_dict()
        with pytest.raises(ValueError, match="privacy_unit"):
            acc.load_state_dict(state)
        assert acc.state_dict() == before  # nothing changed
    with pytest.raises(ValueError, match="privacy_unit"):
        twin.load_state_dict(_stepped(None).state_dict())  # a record state into a user one
    with pytest.raises(TypeError, match="privacy_unit"):
        twin.load_state_dict({**state, "privacy_unit": "user(3)"})
    with pytest.raises(ValueError, match="privacy_unit"):
        twin.load_state_dict({**state, "privacy_unit": {"kind": "user", "max_records": 0}})
    assert twin.num_steps == STEPS


def test_new_accountants_take_the_unit_of_the_block() -> None:
    with unit_of_new_accountants(PrivacyUnit.group(4)):
        assert LastIterateAccountant().unit == PrivacyUnit.group(4)
        assert LastIterateAccountant(unit=PrivacyUnit.user(2)).unit == PrivacyUnit.user(2)
    assert LastIterateAccountant().unit == PrivacyUnit.record()


def _calibrated_sigma(unit: PrivacyUnit | None) -> tuple[float, object]:
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,))), batch_size=8)
    model = nn.Linear(4, 2)
    engine = PrivacyEngine(accountant="last_iterate")
    engine.accountant.unit = unit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, optimizer, _ = engine.make_private_with_epsilon(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=data, target_epsilon=4.0, target_delta=DELTA, epochs=1,
            max_grad_norm=1.0,
        )  # fmt: skip
    return float(optimizer.noise_multiplier), engine.accountant


def test_make_private_with_epsilon_calibrates_for_the_unit() -> None:
    record_sigma, _ = _calibrated_sigma(None)
    sigma, accountant = _calibrated_sigma(PrivacyUnit.user(2))
    assert accountant.unit == PrivacyUnit.user(2)  # type: ignore[attr-defined]
    assert sigma > 1.2 * record_sigma
    # the calibrated noise meets the target for the user (enumeration: 8 steps, q = 1/8)
    exact = _exact_epsilon(_poisson_law(np.ones(8), 1 / 8, 2), sigma * math.sqrt(8))
    assert exact <= 4.0 * (1 + 1e-6)
    below = _exact_epsilon(_poisson_law(np.ones(8), 1 / 8, 2), 0.95 * sigma * math.sqrt(8))
    assert below > 4.0  # and is not far more than needed


def test_a_user_with_one_record_gets_the_record_numbers() -> None:
    one, record = _stepped(PrivacyUnit.user(1)), _stepped(None)
    assert one.get_epsilon(DELTA) == record.get_epsilon(DELTA)
    assert one.get_epsilon(DELTA, robust=True) == record.get_epsilon(DELTA, robust=True)
    fresh_one, fresh_record = LastIterateAccountant(unit=PrivacyUnit.user(1)), LastIterateAccountant()
    batch = fresh_one.replay_steps(SIGMA, Q, None, 4, delta=DELTA)  # the batch solve
    assert batch is not None
    assert np.array_equal(batch, fresh_record.replay_steps(SIGMA, Q, None, 4, delta=DELTA))
    assert one.state_dict()["privacy_unit"] == {"kind": "user", "max_records": 1}
