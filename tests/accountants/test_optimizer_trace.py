"""LastIterateAccountant with learning-rate schedules and momentum read from the optimizer."""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.optimizer_trace import (
    encode_trace,
    trace_as_lists,
    trace_as_text,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning, OptimizerTraceWarning

DELTA = 1e-5
SIGMA = 1.0

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore::opacus_lastiterate.exceptions.NonMonotoneHeuristicWarning",
)


def _engine(digits_dataset, make_optimizer, steps, scheduler=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 10))
    optimizer = make_optimizer(model.parameters())
    loader = DataLoader(digits_dataset, batch_size=64)
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=loader,
        noise_multiplier=SIGMA, max_grad_norm=1.0,
    )
    sched = scheduler(optimizer) if scheduler else None
    taken = 0
    criterion = nn.CrossEntropyLoss()
    while taken < steps:
        for x, y in loader:
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            if sched is not None:
                sched.step()
            taken += 1
            if taken == steps:
                break
    return engine, 1 / len(loader)


def _momentum_weights(lrs, beta):
    """Independent forward simulation of torch SGD momentum: each step's gradient g_t
    contributes lr_s * beta^(s-t) to every later update s >= t."""
    T = len(lrs)
    return np.array([sum(lrs[s] * beta ** (s - t) for s in range(t, T)) for t in range(T)])


def test_plain_sgd_at_constant_rate_uses_the_exact_formula(digits_dataset):
    engine, q = _engine(digits_dataset, lambda p: torch.optim.SGD(p, lr=0.1), 5)
    acc = engine.accountant
    assert acc.optimizer_trace == [(0.1, 0.0, 0.0, False, 0.0, 5)]
    assert engine.get_epsilon(DELTA) == privacy_model("heuristic", DPSGDRun.constant(steps=5, sample_rate=q, noise_multiplier=SIGMA)).epsilon(DELTA)
    assert "Constant-rate formula" in acc.describe()


def test_momentum_changes_the_weights_and_epsilon(digits_dataset):
    from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
        weighted_heuristic_epsilon_result,
    )

    steps, beta = 8, 0.9
    engine, q = _engine(digits_dataset, lambda p: torch.optim.SGD(p, lr=0.1, momentum=beta), steps)
    acc = engine.accountant
    assert acc.optimizer_trace == [(0.1, beta, 0.0, False, 0.0, steps)]
    expected = weighted_heuristic_epsilon_result(
        DELTA, weights=_momentum_weights([0.1] * steps, beta), sample_rates=q,
        noise_multipliers=SIGMA, accuracy=acc.weight_accuracy,
    )
    eps = engine.get_epsilon(DELTA)
    assert eps == pytest.approx(expected.epsilon, rel=2 * acc.weight_accuracy)
    assert eps >= expected.lower_bound
    assert eps != privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=SIGMA)).epsilon(DELTA)
    assert "weighted heuristic" in acc.describe()


def test_step_schedule_is_read_before_each_update(digits_dataset):
    from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
        weighted_heuristic_epsilon_result,
    )

    engine, q = _engine(
        digits_dataset, lambda p: torch.optim.SGD(p, lr=0.4), 6,
        scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.25),
    )
    acc = engine.accountant
    assert acc.optimizer_trace == [(0.4, 0.0, 0.0, False, 0.0, 3), (0.1, 0.0, 0.0, False, 0.0, 3)]
    expected = weighted_heuristic_epsilon_result(
        DELTA, weights=[0.4] * 3 + [0.1] * 3, sample_rates=q, noise_multipliers=SIGMA,
        accuracy=acc.weight_accuracy,
    )
    # answered incrementally: an upper bound within the accuracy of the from-scratch bracket
    got = acc.weighted_result(DELTA)
    assert engine.get_epsilon(DELTA) == got.epsilon
    assert got.epsilon >= expected.lower_bound and got.lower_bound <= expected.epsilon
    assert got.relative_accuracy <= acc.weight_accuracy


def test_an_unsupported_optimizer_falls_back_to_the_constant_rate_formula_with_a_warning(
    digits_dataset,
):
    with pytest.warns(OptimizerTraceWarning, match="Rprop"):
        engine, _ = _engine(digits_dataset, lambda p: torch.optim.Rprop(p, lr=0.01), 3)
    acc = engine.accountant
    assert acc.optimizer_trace == []
    assert engine.get_epsilon(DELTA) == LastIterateHeuristic(acc.history).epsilon(DELTA)
    assert "could not be used" in acc.describe()


def test_trace_survives_state_dict_and_corrupt_traces_are_rejected(digits_dataset):
    engine, _ = _engine(digits_dataset, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5), 4)
    state = engine.accountant.state_dict()
    fresh = LastIterateAccountant()
    fresh.load_state_dict(state)
    assert fresh.optimizer_trace == engine.accountant.optimizer_trace
    assert fresh.get_epsilon(DELTA) == engine.accountant.get_epsilon(DELTA)

    bad = dict(state, optimizer_trace=encode_trace([(0.1, 1.5, 0.0, False, 0.0, 4)]))
    before = (fresh.history, fresh.optimizer_trace)
    with pytest.raises(ValueError, match=r"optimizer_trace'\]\['momentum'\]\['values'\]\[0\]"):
        fresh.load_state_dict(bad)
    assert (fresh.history, fresh.optimizer_trace) == before


def test_non_monotone_region_warns_once_per_doubling():
    acc = LastIterateAccountant()
    for _ in range(3):  # sigma small and q small: eps_1 > eps_3
        acc.step(noise_multiplier=0.5, sample_rate=0.01)
    with pytest.warns(NonMonotoneHeuristicWarning, match="last 1 steps"):
        eps = acc.get_epsilon(DELTA)
    assert acc.get_epsilon(DELTA, robust=True) > eps
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonMonotoneHeuristicWarning)
        acc.step(noise_multiplier=0.5, sample_rate=0.01)  # 4 < 2 * 3: not checked again
        acc.get_epsilon(DELTA)
        acc.get_epsilon(DELTA, check_monotone=False)


def test_monotone_region_does_not_warn():
    acc = LastIterateAccountant()
    for _ in range(50):
        acc.step(noise_multiplier=1.0, sample_rate=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonMonotoneHeuristicWarning)
        acc.get_epsilon(1e-6)


@pytest.mark.parametrize(
    "field, key, value",
    [
        ("lr", "values", -0.1),
        ("lr", "values", math.inf),
        ("lr", "values", math.nan),
        ("lr", "values", True),
        ("momentum", "values", 1.0000001),
        ("dampening", "values", -1e-9),
        ("weight_decay", "values", math.inf),
        ("lr", "steps", 0),
        ("momentum", "steps", 1.0),
        ("nesterov", "values", 1),
    ],
)
def test_a_long_stored_trace_is_checked_column_by_column(field, key, value):
    """A stored trace is validated column by column: the same entries come back from Python
    floats and from numpy scalars (checked one at a time), and a bad value anywhere is
    reported by field and index, with nothing loaded."""
    good = [(0.1 + 1e-4 * i, 0.9, 0.0, False, 0.0, 1 + i % 3) for i in range(500)]
    good.append((0.2, 1.0, 1.0, True, 0.5, 7))  # closed ends of [0, 1]
    stored = trace_as_lists(encode_trace(good))
    via_numpy = {f: {"values": [np.float64(v) if type(v) is float else v for v in c["values"]],
                     "steps": c["steps"]} for f, c in stored.items()}  # fmt: skip
    state = {"history": [(1.0, 0.01, sum(e[5] for e in good))], "mechanism": "last_iterate"}
    plain, numpy_typed = LastIterateAccountant(), LastIterateAccountant()
    plain.load_state_dict(dict(state, optimizer_trace=stored))
    numpy_typed.load_state_dict(dict(state, optimizer_trace=via_numpy))
    assert plain.optimizer_trace == numpy_typed.optimizer_trace == good
    bad = copy.deepcopy(stored)
    bad[field][key][300 if field == "lr" else 0] = value
    at = 300 if field == "lr" else 0
    with pytest.raises((TypeError, ValueError), match=rf"'{field}'\]\['{key}'\]\[{at}\]"):
        plain.load_state_dict(dict(state, optimizer_trace=bad))
    assert plain.optimizer_trace == good


def test_the_stored_trace_is_each_setting_run_length_encoded_and_round_trips_exactly():
    """A schedule that changes the rate at every step stores one float and one run length per
    step, the constant settings one run each; the entries (merged runs of identical
    settings) come back with the same floats, also through JSON and torch.load(weights_only)."""
    import io
    import json

    lrs = [0.05 * 0.5 * (1 + math.cos(math.pi * t / 1000)) for t in range(1000)]
    trace = [(lr, 0.9, 0.0, False, 0.0, 1) for lr in lrs[:500]]
    trace += [(lr, 0.5, 0.1, True, 1e-4, 2) for lr in lrs[500:]]
    stored = encode_trace(trace)
    assert len(stored["lr"]["values"]) == len(stored["lr"]["steps"]) == 8 * 1000  # bytes
    assert len(stored["momentum"]["values"]) == 8 * 2
    lists = trace_as_lists(stored)
    assert lists["lr"] == {"values": lrs, "steps": [1] * 500 + [2] * 500}
    assert lists["momentum"] == {"values": [0.9, 0.5], "steps": [500, 1000]}
    assert lists["nesterov"] == {"values": [False, True], "steps": [500, 1000]}
    history = [(1.0, 0.01, 1500)]
    for copy_of in (
        lambda s: json.loads(json.dumps(trace_as_text(s))),
        lambda s: _torch_round_trip(s, io.BytesIO()),
        lambda s: trace_as_lists(s),
        lambda s: json.loads(json.dumps(trace_as_lists(s))),
    ):
        acc = LastIterateAccountant()
        acc.load_state_dict({"history": history, "mechanism": "last_iterate",
                             "optimizer_trace": copy_of(stored)})  # fmt: skip
        assert acc.optimizer_trace == trace
        assert acc.state_dict()["optimizer_trace"] == stored
    short = trace_as_lists(stored)
    short["momentum"]["steps"][-1] -= 1
    with pytest.raises(ValueError, match=r"every setting must cover the same steps"):
        LastIterateAccountant().load_state_dict(
            {"history": history, "mechanism": "last_iterate", "optimizer_trace": short}
        )


@pytest.mark.parametrize(
    "field, key, edit, error, message",
    [
        ("lr", "values", lambda b: b[:-1], ValueError, r"whole 8-byte elements, got 7999"),
        ("lr", "values", lambda b: _put(b, 300, "<f8", math.nan), ValueError, r"\[300\]"),
        ("momentum", "values", lambda b: _put(b, 0, "<f8", 1.5), ValueError, r"\[0\]"),
        ("lr", "steps", lambda b: _put(b, 7, "<i8", 0), ValueError, r"\['steps'\]\[7\]"),
        ("nesterov", "values", lambda b: b"\x02", ValueError, r"must be 0 or 1"),
        ("lr", "values", lambda b: "not base64!", ValueError, r"base64"),
        ("lr", "steps", lambda b: 3.0, TypeError, r"bytes, base64 text or a list"),
    ],
)
def test_a_stored_trace_in_bytes_is_checked_before_anything_changes(field, key, edit, error,
                                                                    message):  # fmt: skip
    """The bytes form is validated as the lists are: a bad element named by its index, a
    column of partial elements or other types refused, the accountant left as it was."""
    good = [(0.1 + 1e-4 * i, 0.9, 0.0, False, 0.0, 1) for i in range(1000)]
    stored = encode_trace(good)
    state = {"history": [(1.0, 0.01, 1000)], "mechanism": "last_iterate"}
    acc = LastIterateAccountant()
    acc.load_state_dict(dict(state, optimizer_trace=stored))
    assert acc.optimizer_trace == good
    bad = copy.deepcopy(stored)
    bad[field][key] = edit(bad[field][key])
    with pytest.raises(error, match=message):
        acc.load_state_dict(dict(state, history=[(2.0, 0.01, 1000)], optimizer_trace=bad))
    assert acc.optimizer_trace == good and acc.history == [(1.0, 0.01, 1000)]


def _put(raw, i, kind, value):
    column = np.frombuffer(raw, dtype=kind).copy()
    column[i] = value
    return column.tobytes()


def _torch_round_trip(state, buffer):
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_a_trace_of_the_later_steps_only_is_saved_as_unusable_and_loads():
    """A step recorded without the optimizer leaves a trace of the later steps only: such an
    accountant never weighs its steps, and its own state (the settings marked unusable, the
    partial trace not stored: a stored trace must cover every step) loads back to the same
    epsilon."""
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings

    acc = LastIterateAccountant()
    acc.step(noise_multiplier=SIGMA, sample_rate=0.05)  # no optimizer seen
    for _ in range(4):  # as the optimizer hook records them, with momentum
        acc.replay_step(SIGMA, 0.05, SGDSettings(0.1, 0.5, 0.0, False, 0.0))
    assert sum(e[5] for e in acc.optimizer_trace) == 4 and acc.num_steps == 5
    assert not acc.uses_weights
    state = acc.state_dict()
    assert state["optimizer_trace"] == encode_trace([]) and state["optimizer_trace_disabled"]
    fresh = LastIterateAccountant()
    fresh.load_state_dict(state)
    assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    assert not fresh.uses_weights
