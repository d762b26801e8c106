"""The ``"feasgm"`` and ``"asgm"`` Opacus accountants (``docs/normalisation.md``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from opacus import PrivacyEngine
from opacus.accountants import RDPAccountant
from torch import nn

from opacus_lastiterate.accountants import ASGMAccountant, FEASGMAccountant, NormalisationWarning
from opacus_lastiterate.accountants.registration import registered_accountants
from opacus_lastiterate.analysis.baselines.composition import (
    StandardComposition,
)
from opacus_lastiterate.analysis.normalisation import asgm_delta, asgm_epsilon
from opacus_lastiterate.analysis.normalisation.divisor_leak import feasgm_epsilon
from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")

DELTA = 1e-5
SIGMA = 1.1
Setup = Callable[[], tuple[nn.Module, torch.optim.Optimizer, Any]]
Train = Callable[..., int]

SAFE = (60000, 256)  # MNIST-like: the divisor 255 is the same for N - 1, N, N + 1
UNSAFE = (10, 8)  # c = 4, 5, 5 for N = 9, 10, 11
DIGITS_PARAMS = 64 * 16 + 16 + 16 * 10 + 10
FAST = 3e-3  # a coarser (still pessimistic) PLD grid for the curve, to keep the tests fast


def _q(n: int, b: int) -> float:
    return opacus1x_batch_arithmetic(n, b).accountant_rate


def _feasgm(
    n: int, b: int, history: list[tuple[float, float, int]], **config: Any
) -> FEASGMAccountant:
    acc = FEASGMAccountant().configure(dataset_size=n, batch_size=b, **config)
    acc.history = history
    return acc


# -- registration --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "cls"), [("feasgm", FEASGMAccountant), ("asgm", ASGMAccountant)])
def test_registered_under_their_names(name: str, cls: type) -> None:
    assert cls.mechanism() == name
    assert registered_accountants()[name] is cls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert type(PrivacyEngine(accountant=name).accountant) is cls
    acc = cls()  # zero-argument constructor, empty history
    assert acc.history == [] and len(acc) == 0 and acc.get_epsilon(DELTA) == 0.0


# -- missing configuration -----------------------------------------------------------------------


def test_get_epsilon_without_configuration_names_what_is_missing() -> None:
    feasgm = FEASGMAccountant()
    feasgm.step(noise_multiplier=SIGMA, sample_rate=0.1)
    with pytest.raises(ValueError, match="`dataset_size`, `batch_size`.*configure"):
        feasgm.get_epsilon(DELTA)
    feasgm.configure(dataset_size=100)
    with pytest.raises(ValueError, match="needs `batch_size`"):
        feasgm.get_epsilon(DELTA)
    feasgm.configure(batch_size=10)
    with pytest.raises(ValueError, match="needs `dimension`"):
        feasgm.curve_epsilon(DELTA)
    asgm = ASGMAccountant()
    asgm.step(noise_multiplier=SIGMA, sample_rate=0.1)
    with pytest.raises(ValueError, match="needs `dataset_size`"):
        asgm.get_epsilon(DELTA)


def test_make_private_with_epsilon_fails_clearly(make_setup: Setup) -> None:
    model, optimizer, loader = make_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="feasgm")
    with pytest.raises(ValueError, match="dataset_size"):
        engine.make_private_with_epsilon(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            target_epsilon=3.0,
            target_delta=DELTA,
            epochs=1,
            max_grad_norm=1.0,
        )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dataset_size": 0}, ValueError, "dataset_size"),
        ({"dataset_size": 10.0}, TypeError, "dataset_size"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"dimension": -1}, ValueError, "dimension"),
        ({"drop_last": 1}, TypeError, "drop_last"),
        ({"public_divisor": 0.0}, ValueError, "public_divisor"),
        ({"standard": "moments"}, ValueError, "standard"),
        ({"data_loader": [1, 2]}, TypeError, "data_loader"),
    ],
)
def test_configure_validates_before_changing_anything(
    kwargs: dict, error: type, match: str
) -> None:
    acc = FEASGMAccountant().configure(dataset_size=50, batch_size=5)
    before = acc.configuration
    with pytest.raises(error, match=match):
        acc.configure(**{"batch_size": 7, **kwargs})  # a valid change alongside the bad one
    assert acc.configuration == before


# -- FEASGM --------------------------------------------------------------------------------------


def test_feasgm_safe_gives_the_standard_epsilon_of_the_users_choice() -> None:
    n, b = SAFE
    history = [(SIGMA, _q(n, b), 30)]
    acc = _feasgm(n, b, history)
    assert acc.verdict == feasgm_verdict(n, b) and acc.verdict.safe
    assert acc.get_epsilon(DELTA) == pytest.approx(
        StandardComposition(history).epsilon(DELTA), rel=1e-12
    )
    with pytest.raises(TypeError, match="target_epsilon"):  # a keyword is not ignored
        acc.get_epsilon(DELTA, target_epsilon=1.0)
    rdp = RDPAccountant()
    rdp.history = list(history)
    acc.configure(standard="rdp")
    assert acc.get_epsilon(DELTA) == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-12)


@pytest.mark.parametrize("history", [[(SIGMA, 0.05, 30)], [(0.8, 0.5, 3), (2.0, 0.01, 100)]])
def test_feasgm_rdp_delta_inverts_opacus_s_rdp_epsilon(history: list) -> None:
    """standard="rdp": get_delta is the delta at which Opacus's own RDPAccountant reports
    that epsilon (before, get_delta was the PLD delta whatever the standard, and
    get_epsilon(get_delta(1.0)) was 1.56 on the first history)."""
    acc = _feasgm(*SAFE, history, standard="rdp")
    rdp = RDPAccountant()
    rdp.history = list(history)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Optimal order is the largest alpha"
        for eps in (0.0, 0.3, 1.0, 5.0):
            delta = acc.get_delta(eps)
            assert 0.0 < delta < 1.0
            assert rdp.get_epsilon(delta) == pytest.approx(eps, rel=1e-10, abs=1e-12)
            assert acc.get_epsilon(delta) == pytest.approx(eps, rel=1e-10, abs=1e-12)
        for delta in (1e-8, DELTA, 0.1):
            assert acc.get_delta(rdp.get_epsilon(delta)) == pytest.approx(delta, rel=1e-10)


def test_feasgm_prv_has_no_delta_and_says_what_to_use() -> None:
    acc = _feasgm(*SAFE, [(SIGMA, _q(*SAFE), 3)], standard="prv")
    with pytest.raises(NotImplementedError, match=r"standard='prv'.*configure\(standard='pld'\)"):
        acc.get_delta(1.0)
    with pytest.raises(ValueError, match="`epsilon`"):  # bad input is still bad input
        acc.get_delta(-1.0)
    assert FEASGMAccountant().configure(standard="prv").get_delta(1.0) == 0.0  # nothing recorded
    assert math.isfinite(acc.get_epsilon(DELTA))


def test_feasgm_unsafe_is_inf_with_the_reason_and_the_curve_is_finite() -> None:
    n, b = UNSAFE
    acc = _feasgm(n, b, [(SIGMA, _q(n, b), 5)], dimension=20)
    assert math.isinf(acc.get_epsilon(DELTA))
    assert acc.verdict.verdict == "unsafe" and acc.verdict.divisors == (4.0, 5.0, 5.0)
    assert "c = 4, 5, 5" in acc.verdict.reason
    common = {
        "dataset_size": n,
        "batch_size": b,
        "noise_multiplier": SIGMA,
        "steps": 5,
        "dimension": 20,
    }
    curve = acc.curve_epsilon(DELTA, value_discretization_interval=FAST)
    expected = feasgm_epsilon(DELTA, **common, value_discretization_interval=FAST)
    assert curve == pytest.approx(expected, rel=1e-12) and math.isfinite(curve)
    text = acc.describe(DELTA)
    assert "unsafe" in text and "inf" in text and "d = 20" in text and "c = 4, 5, 5" in text


def test_feasgm_curve_composes_segments_exactly() -> None:
    n, b = UNSAFE
    q = _q(n, b)

    def curve(history: list[tuple[float, float, int]]) -> float:
        return _feasgm(n, b, history, dimension=20).curve_epsilon(
            DELTA, value_discretization_interval=FAST
        )

    whole = curve([(SIGMA, q, 5)])
    # Composition of PLDs on one grid is associative; what differs is the floating-point
    # rounding of dp_accounting's convolutions (measured 6e-12 relative).
    assert curve([(SIGMA, q, 2), (SIGMA, q, 3)]) == pytest.approx(whole, rel=1e-9)
    assert curve([(2.0, q, 5)]) < curve([(SIGMA, q, 2), (2.0, q, 3)]) < whole


def test_feasgm_public_divisor_with_changing_sample_rate_is_still_unsafe() -> None:
    # N = 9, L = 8: ceil(N / L) is 1, 2, 2 for N = 8, 9, 10, so q changes even with a public c
    acc = _feasgm(9, 8, [(SIGMA, _q(9, 8), 3)], public_divisor=8.0)
    assert acc.verdict.rule.startswith("public divisor") and not acc.verdict.safe
    assert "sampling rate" in acc.verdict.reason and math.isinf(acc.get_epsilon(DELTA))


def test_feasgm_warns_when_the_recorded_rate_does_not_match_the_configuration() -> None:
    n, b = SAFE
    acc = _feasgm(n, b, [(SIGMA, 0.1, 3)])
    with pytest.warns(NormalisationWarning, match="sample rates"):
        acc.get_epsilon(DELTA)


def test_feasgm_end_to_end_reads_d_and_the_divisor_from_the_optimizer(
    make_setup: Setup, train: Train
) -> None:
    model, optimizer, loader = make_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="feasgm")
    acc = engine.accountant
    acc.configure(data_loader=loader)  # N = 1797, L = 64 from the user's DataLoader
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=SIGMA,
        max_grad_norm=1.0,
    )
    train(model, optimizer, loader, 3)
    config = acc.configuration
    n, b = config["dataset_size"], config["batch_size"]
    assert (n, b, config["dimension"]) == (1797, 64, DIGITS_PARAMS)
    assert config["optimizer_divisor"] == optimizer.expected_batch_size == 61
    assert acc.history == [(SIGMA, 1 / 29, 3)]
    assert acc.verdict == feasgm_verdict(n, b) and not acc.verdict.safe  # 61, 61, 62
    assert math.isinf(engine.get_epsilon(DELTA))
    assert acc.curve_epsilon(DELTA, value_discretization_interval=FAST) == pytest.approx(
        feasgm_epsilon(
            DELTA,
            dataset_size=n,
            batch_size=b,
            noise_multiplier=SIGMA,
            steps=3,
            dimension=DIGITS_PARAMS,
            value_discretization_interval=FAST,
        ),
        rel=1e-12,
    )


def test_configure_from_a_dp_data_loader_reads_only_n(make_setup: Setup) -> None:
    model, optimizer, loader = make_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, _, dp_loader = PrivacyEngine().make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=1.0,
        )
    config = FEASGMAccountant().configure(data_loader=dp_loader).configuration
    assert config["dataset_size"] == 1797 and config["batch_size"] is None


# -- state ---------------------------------------------------------------------------------------


def test_state_dict_round_trip_keeps_the_configuration() -> None:
    n, b = UNSAFE
    acc = _feasgm(n, b, [(SIGMA, _q(n, b), 4)], dimension=12, standard="prv")
    state = acc.state_dict()
    assert state["mechanism"] == "feasgm" and state["configuration"]["dimension"] == 12
    fresh = FEASGMAccountant()
    fresh.load_state_dict(state)
    assert fresh.history == acc.history and fresh.configuration == acc.configuration
    legacy = dict(state, mechanism=FEASGMAccountant.mechanism)  # Opacus < 1.6 stored the method
    FEASGMAccountant().load_state_dict(legacy)


@pytest.mark.parametrize(
    "change",
    [
        {"mechanism": "asgm"},
        {"history": [(SIGMA, 1.5, 3)]},
        {"configuration": {"dataset_size": 10}},
        {"configuration": "nope"},
    ],
)
def test_bad_state_is_rejected_and_leaves_the_accountant_unchanged(change: dict) -> None:
    acc = _feasgm(*SAFE, [(SIGMA, _q(*SAFE), 2)])
    state = dict(acc.state_dict(), **change)
    target = _feasgm(50, 5, [(2.0, 0.2, 1)])
    before = (list(target.history), target.configuration)
    with pytest.raises((TypeError, ValueError)):
        target.load_state_dict(state)
    assert (target.history, target.configuration) == before


def test_bad_configuration_value_in_state_is_rejected() -> None:
    acc = _feasgm(*SAFE, [])
    state = acc.state_dict()
    state["configuration"] = dict(state["configuration"], batch_size=-4)
    with pytest.raises(ValueError, match=r"state_dict\['configuration'\].batch_size"):
        FEASGMAccountant().load_state_dict(state)


# -- ASGM ----------------------------------------------------------------------------------------


def test_asgm_matches_the_analysis_function_and_composes_segments() -> None:
    acc = ASGMAccountant().configure(dataset_size=20)
    for _ in range(4):
        acc.step(noise_multiplier=2.0, sample_rate=0.1)
    assert acc.history == [(2.0, 0.1, 4)]
    kwargs = {"dataset_size": 20, "sample_rate": 0.1, "noise_multiplier": 2.0, "steps": 4}
    assert acc.get_epsilon(DELTA) == pytest.approx(asgm_epsilon(DELTA, **kwargs), rel=1e-12)
    assert acc.get_delta(1.0) == pytest.approx(asgm_delta(1.0, **kwargs), rel=1e-12)
    split = ASGMAccountant().configure(dataset_size=20)
    split.history = [(2.0, 0.1, 1), (2.0, 0.1, 3)]
    # one grid, so only floating-point rounding differs (measured 1.5e-13 relative)
    assert split.get_epsilon(DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    mixed = ASGMAccountant().configure(dataset_size=20)
    mixed.history = [(2.0, 0.1, 2), (2.0, 0.05, 2)]
    low = asgm_epsilon(DELTA, **dict(kwargs, sample_rate=0.05))
    assert low < mixed.get_epsilon(DELTA) < acc.get_epsilon(DELTA)
    assert "ASGM (batch size revealed" in acc.describe(DELTA)


@pytest.mark.parametrize(
    "history",
    [
        [(1.0, 1.0, 1), (2.0, 1.0, 1)],
        [(1.0, 0.5, 1), (2.0, 1.0, 1)],
        [(1.0, 1.0, 1), (2.0, 0.5, 1)],
        [(1.0, 0.5, 1), (1.0, 0.99999, 6)],  # finite mass 1e-30: truncated away
    ],
)
def test_asgm_step_that_samples_everything_reveals_the_target(history: list) -> None:
    """A step with q = 1 releases the batch size N or N - 1: the target is revealed with
    probability 1, so epsilon = inf and delta = 1 for every history containing one (before,
    composing such a segment with another raised IndexError inside dp_accounting)."""
    acc = ASGMAccountant().configure(dataset_size=20)
    acc.history = history
    assert acc.get_epsilon(DELTA) == math.inf
    assert acc.get_delta(1.0) == acc.get_delta(100.0) == 1.0


def test_asgm_warns_on_an_optimizer_that_divides_by_expected_batch_size(
    make_setup: Setup, train: Train
) -> None:
    model, optimizer, loader = make_setup()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = PrivacyEngine(accountant="asgm")
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=loader,
            noise_multiplier=SIGMA,
            max_grad_norm=1.0,
        )
    with pytest.warns(NormalisationWarning, match="feasgm"):
        train(model, optimizer, loader, 2)
    engine.accountant.configure(dataset_size=len(loader.dataset))
    assert engine.get_epsilon(DELTA) == pytest.approx(
        asgm_epsilon(DELTA, dataset_size=1797, sample_rate=1 / 29, noise_multiplier=SIGMA, steps=2),
        rel=1e-12,
    )
