"""The privacy unit goes through the one chooser: privacy_model(name, run) on a run whose unit
is a user or a group builds the unit's model (its number, its label), the names without one
refuse the run, and a record-level model built directly refuses it instead of giving the
number of one record."""

from __future__ import annotations

import pytest

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import ShuffledBatches
from opacus_lastiterate.analysis.sampling_heuristic import SamplingHeuristic

DELTA = 1e-5


def _run(unit: PrivacyUnit, sampling: object = None, steps: int = 20) -> DPSGDRun:
    return DPSGDRun.from_history([(1.0, 0.1, steps)], sampling=sampling, unit=unit)  # type: ignore[arg-type]


@pytest.mark.parametrize("unit", [PrivacyUnit.user(max_records=4), PrivacyUnit.group(4)])
def test_user_run_gets_the_users_number_not_the_records(unit: PrivacyUnit) -> None:
    run = _run(unit)
    record = privacy_model("heuristic", _run(PrivacyUnit.record())).epsilon(DELTA)
    user = privacy_model("heuristic", run)
    assert user.units and ("4 records" in user.label or "group" in user.label)
    # Poisson, constant rate: the user's count is Binomial(k T, q) with the same noise, so
    # the user's heuristic is the record-level one of k T steps at sigma / sqrt(k)
    k_steps = privacy_model(
        "heuristic", DPSGDRun.from_history([(0.5, 0.1, 80)])
    ).epsilon(DELTA)
    assert user.epsilon(DELTA) == pytest.approx(k_steps, rel=2e-3)
    assert user.epsilon(DELTA) > 2 * record
    standard = privacy_model("standard", run)
    assert standard.epsilon(DELTA) > privacy_model(
        "standard", _run(PrivacyUnit.record())
    ).epsilon(DELTA)


def test_epoch_scheme_user_run_gets_the_epoch_models() -> None:
    scheme = ShuffledBatches(dataset_size=100, batch_size=10)
    user = privacy_model("heuristic", _run(PrivacyUnit.user(max_records=2), scheme))
    assert user.units and "user" in user.label
    assert user.epsilon(DELTA) > privacy_model(
        "heuristic", _run(PrivacyUnit.record(), scheme)
    ).epsilon(DELTA)


@pytest.mark.parametrize("name", ["robust_heuristic", "full_batch", "standard_rdp"])
def test_names_without_a_user_model_refuse_a_user_run(name: str) -> None:
    with pytest.raises(ValueError, match="`unit`"):
        privacy_model(name, _run(PrivacyUnit.user(max_records=3)))


@pytest.mark.parametrize("cls", [LastIterateHeuristic, StandardComposition])
def test_record_level_models_refuse_a_user_run(cls: type) -> None:
    model = cls(_run(PrivacyUnit.user(max_records=3)))
    with pytest.raises(ValueError, match="privacy_model"):
        model.epsilon(DELTA)
    with pytest.raises(ValueError, match="privacy_model"):
        model.delta(1.0)


def test_epoch_record_level_model_refuses_a_user_run() -> None:
    scheme = ShuffledBatches(dataset_size=100, batch_size=10)
    model = SamplingHeuristic(_run(PrivacyUnit.group(2), scheme))
    with pytest.raises(ValueError, match="privacy_model"):
        model.epsilon(DELTA)


@pytest.mark.parametrize(
    "name", ["heuristic", "robust_heuristic", "standard", "standard_rdp", "full_batch"]
)
def test_a_sampled_user_gets_every_record_level_model(name: str) -> None:
    """Under user-level sampling a user makes one clipped contribution per step it is sampled
    in: every name builds its record-level class (its numbers are those of a dataset of users;
    checked against independent computations in tests/test_user_samplers.py)."""
    unit = PrivacyUnit.sampled_user()
    model = privacy_model(name, _run(unit))
    record_model = privacy_model(name, _run(PrivacyUnit.record()))
    assert type(model) is type(record_model) and not model.units
    assert model.run.unit.label() == "user-level sampling"


def test_sampled_user_unit_is_validated_and_round_trips() -> None:
    unit = PrivacyUnit.sampled_user()
    assert (unit.kind, unit.max_records) == ("sampled_user", 1)
    assert PrivacyUnit.from_dict(unit.as_dict()) == unit
    assert not unit.is_record and "clipped together" in unit.describe()
    with pytest.raises(ValueError, match="max_records"):
        PrivacyUnit("sampled_user", 3)
