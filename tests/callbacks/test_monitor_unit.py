"""The monitor of an accountant whose privacy unit is a user: every record names the unit, its
heuristic and standard values are the user's (against the enumeration and dp_accounting
references of tests/analysis/test_user_level.py), its labels say what each number protects,
the sinks write it, and checkpoints keep it."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.callbacks import JsonlSink, PrivacyBudget, PrivacyMonitor
from opacus_lastiterate.callbacks.records import EpsilonRecord, labels_for
from tests.analysis._reference import ClosedFormMixture
from tests.analysis.test_user_level import _exact_epsilon, _poisson_law
from tests.callbacks.conftest import BATCH, DELTA, N, make_dp, train

Q = BATCH / N  # 1/8, sigma 1 (make_dp)
USER = PrivacyUnit.user(2)


def _user_heuristic(steps: int) -> float:
    """The user's heuristic after ``steps`` steps, by enumerating every sampling outcome."""
    return _exact_epsilon(_poisson_law(np.ones(steps), Q, 2), math.sqrt(steps))


def _user_step_exact() -> float:
    """The exact epsilon of one step's mixture of Gaussians for the user (closed form)."""
    counts = np.arange(3)
    return ClosedFormMixture(counts, stats.binom.pmf(counts, 2, Q), 1.0).epsilon(DELTA)


def test_records_are_the_users_numbers_and_say_so(tmp_path) -> None:
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = USER
    records: list[EpsilonRecord] = []
    log = tmp_path / "privacy.jsonl"
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append, JsonlSink(log)], robust_every=1,
        standard_every=None, flush_every=None,
    )
    monitor.attach(opt)
    train(model, opt, loader, 2)
    final = monitor.finish()
    assert final is not None
    for record in records:
        assert record.privacy_unit == "user(2)"
        assert record.heuristic_epsilon == pytest.approx(_user_heuristic(record.step), rel=1e-8)
        assert record.robust_heuristic_epsilon is None  # no robust model for a user
    assert final.standard_epsilon > final.heuristic_epsilon
    labels = final.labels()
    assert "protects one user with at most 2 records" in labels["heuristic_epsilon"]
    assert "protects one user with at most 2 records" in labels["standard_epsilon"]
    assert "one record only" in labels["opacus_rdp_epsilon"]  # Opacus's accountant: a record
    assert "not computed" in labels["robust_heuristic_epsilon"]
    written = [json.loads(line) for line in log.read_text().splitlines()]
    assert {row["privacy_unit"] for row in written} == {"user(2)"}
    assert EpsilonRecord.from_dict(written[-1]) == final


def test_the_standard_field_is_the_users_bound() -> None:
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = USER
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, flush_every=None)
    train(model, opt, loader, 1)
    final = monitor.finish()
    assert final is not None and final.step == 1
    # the PLD bound (the same construction dp_accounting's accountant is checked against in
    # tests/analysis/test_user_level.py), pessimistic by at most the grid's rounding
    exact = _user_step_exact()
    assert exact <= final.standard_epsilon <= exact + 2e-3
    assert final.opacus_rdp_epsilon < exact  # Opacus's accountant: one record's


def test_record_run_labels_and_field_are_unchanged() -> None:
    assert labels_for("poisson", privacy_unit="record") == labels_for("poisson")
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=1)
    train(model, opt, loader, 2)
    assert records[-1].privacy_unit == "record"
    assert records[-1].heuristic_epsilon < _user_heuristic(2) / 1.5


def test_from_dict_validates_the_unit() -> None:
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = PrivacyUnit.group(3)
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, flush_every=1)
    train(model, opt, loader, 1)
    values = monitor.last_record.as_dict()
    assert values["privacy_unit"] == "group(3)"
    for bad, error in (("person", ValueError), ("user(0)", ValueError), (3, TypeError)):
        with pytest.raises(error, match="privacy_unit"):
            EpsilonRecord.from_dict({**values, "privacy_unit": bad})
    with pytest.raises(ValueError, match="privacy_unit"):
        labels_for("poisson", privacy_unit="users")


def test_checkpoint_keeps_the_unit_and_refuses_another() -> None:
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = USER
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, flush_every=1)
    train(model, opt, loader, 3)
    state = json.loads(json.dumps(monitor.state_dict()))  # a JSON checkpoint
    other, *_ = make_dp()
    refused = PrivacyMonitor(other, delta=DELTA)
    with pytest.raises(ValueError, match="privacy_unit"):
        refused.load_state_dict(state)
    assert other.accountant.num_steps == 0 and refused.last_record is None  # nothing loaded
    other.accountant.unit = USER
    refused.load_state_dict(state)
    assert refused.last_record.privacy_unit == "user(2)"
    assert other.accountant.get_epsilon(DELTA) == pytest.approx(_user_heuristic(3), rel=1e-8)


def test_a_budget_on_the_users_heuristic_is_not_certified_by_record_bounds() -> None:
    # between the user's heuristic after 2 and after 3 steps: far above every record bound
    limit = 0.5 * (_user_heuristic(2) + _user_heuristic(3))
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = USER
    monitor = PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt, budget=PrivacyBudget(limit, action="stop"),
        flush_every=1,
    )
    train(model, opt, loader, 4)
    assert monitor.should_stop and engine.accountant.num_steps == 2


def test_a_robust_budget_is_refused_for_a_user() -> None:
    engine, model, opt, loader = make_dp()
    engine.accountant.unit = USER
    PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt,
        budget=PrivacyBudget(100.0, metric="robust_heuristic_epsilon"), flush_every=1,
    )
    with pytest.raises(ValueError, match="robust_heuristic_epsilon"):
        train(model, opt, loader, 1)


def test_shuffled_batches_keep_opacus_field_record_level_and_the_rest_the_users() -> None:
    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.analysis.sampling import ShuffledBatches
    from tests.analysis._reference import gaussian_mechanism_epsilon
    from tests.analysis.test_user_level import _epochs, _product, _shuffled_epoch_law

    n, b, steps, sigma = 6, 2, 6, 0.8  # two epochs of three batches
    accountant = LastIterateAccountant(unit=USER)
    accountant.declare_sampling(ShuffledBatches(n, b))
    for _ in range(steps):
        accountant.step(noise_multiplier=sigma, sample_rate=b / n)
    final = PrivacyMonitor(accountant, delta=DELTA).finish()
    assert final is not None and final.sampling == "shuffled" and final.privacy_unit == "user(2)"
    laws = [_shuffled_epoch_law(n, b, False, 2, e) for e in _epochs(np.ones(steps), n // b)]
    exact = _exact_epsilon(_product(laws), sigma * math.sqrt(steps))
    assert final.heuristic_epsilon == pytest.approx(exact, rel=1e-8)
    # every epoch a Gaussian mechanism: sensitivity 1 for a record, 2 for the user's records
    mu = math.sqrt(2) / sigma
    assert final.opacus_rdp_epsilon >= gaussian_mechanism_epsilon(mu, DELTA) * (1 - 1e-6)
    assert final.opacus_rdp_epsilon < gaussian_mechanism_epsilon(2 * mu, DELTA)
    assert final.standard_epsilon == pytest.approx(gaussian_mechanism_epsilon(2 * mu, DELTA), rel=1e-6)
    assert "one record only" in final.labels()["poisson_assumed_epsilon"]  # Opacus's number
