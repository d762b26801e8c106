"""The stored adaptive-optimizer trace of LastIterateAccountant (accountants/adaptive_trace.py):
columns of bytes that round-trip to the same floats (torch.load(weights_only=True), JSON as
base64 text, the plain lists), every malformed field refused before anything changes (the
settings' own constructor is the reference for what is malformed), an incomplete trace
refused, and a size linear in the steps whose settings change."""

from __future__ import annotations

import copy
import io
import json
import math
import pickle
import warnings

import numpy as np
import pytest
import torch

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.adaptive_trace import (
    adaptive_trace_as_lists,
    decode_adaptive_trace,
    encode_adaptive_trace,
)
from opacus_lastiterate.accountants.optimizer_trace import trace_as_text
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    ADAPTIVE_STEP_FIELDS,
    AdaptiveStep,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings

DELTA = 1e-5
SIGMA, RATE = 1.2, 0.01
pytestmark = pytest.mark.filterwarnings(
    "ignore::opacus_lastiterate.exceptions.AdaptiveHeuristicWarning"
)


def _cosine(t: int, steps: int, base: float = 1e-3) -> float:
    return base * 0.5 * (1.0 + math.cos(math.pi * t / steps))


def _adamw_steps(steps: int, noise_changes: bool = False) -> list[AdaptiveStep]:
    """AdamW under a cosine schedule: a new learning rate (and with ``noise_changes`` a new
    noise std) at every step."""
    return [
        AdaptiveStep(
            AdaptiveSettings("adamw", _cosine(t, steps), weight_decay=0.01),
            0.02 * (1.0 + 1e-3 * t) if noise_changes else 0.02,
        )
        for t in range(steps)
    ]


def _accountant(steps: list[AdaptiveStep]) -> LastIterateAccountant:
    acc = LastIterateAccountant()
    for step in steps:
        acc.replay_step(SIGMA, RATE, step)
    return acc


def _torch_copy(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _json_copy(state):
    return json.loads(
        json.dumps(dict(state, adaptive_trace=trace_as_text(state["adaptive_trace"])))
    )


def _lists_copy(state):
    return json.loads(
        json.dumps(dict(state, adaptive_trace=adaptive_trace_as_lists(state["adaptive_trace"])))
    )


@pytest.mark.parametrize("copy_of", [_torch_copy, _json_copy, _lists_copy, copy.deepcopy])
def test_the_trace_round_trips_to_the_same_floats_and_the_accountant_continues_identically(copy_of):
    steps = _adamw_steps(300, noise_changes=True)
    acc = _accountant(steps)
    state = acc.state_dict()
    fresh = LastIterateAccountant()
    fresh.load_state_dict(copy_of(state))
    # the recorded values themselves, not our encoder's: the rates and stds fed in, in order
    assert [s.settings.lr for s, _ in fresh.adaptive_trace] == [s.settings.lr for s in steps]
    assert [s.noise_std for s, _ in fresh.adaptive_trace] == [s.noise_std for s in steps]
    assert fresh.adaptive_trace == acc.adaptive_trace == [(s, 1) for s in steps]
    for key, part in fresh.state_dict()["adaptive_trace"].items():
        assert part == state["adaptive_trace"][key]  # the same bytes
    assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    for t in range(3):  # both take the same steps: the same floats
        step = AdaptiveStep(AdaptiveSettings("adamw", 1e-4 * (t + 1), weight_decay=0.01), 0.03)
        for a in (acc, fresh):
            a.replay_step(SIGMA, RATE, step)
        assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)


def test_the_monitor_checkpoint_holds_the_trace_as_json_text():
    from opacus_lastiterate.callbacks._checkpoint import _plain

    acc = _accountant(_adamw_steps(50))
    plain = _plain(acc.state_dict())
    assert isinstance(plain["adaptive_trace"]["lr"]["values"], str)  # base64
    fresh = LastIterateAccountant()
    fresh.load_state_dict(json.loads(json.dumps(plain)))
    assert fresh.adaptive_trace == acc.adaptive_trace


def test_the_plain_lists_of_earlier_versions_load():
    steps = (
        _adamw_steps(20)
        + [AdaptiveStep(AdaptiveSettings("adamw", 1e-4, weight_decay=0.01), 0.02)] * 5
    )
    runs = [(s, 1) for s in steps[:20]] + [(steps[-1], 5)]
    legacy = {  # each field its own runs of Python values, as earlier versions stored it
        field: {"values": [], "steps": []} for field in ADAPTIVE_STEP_FIELDS
    }
    for step, n in runs:
        for field, value in zip(ADAPTIVE_STEP_FIELDS, step.as_tuple(), strict=True):
            part = legacy[field]
            if part["values"] and part["values"][-1] == value:
                part["steps"][-1] += n
            else:
                part["values"].append(value)
                part["steps"].append(n)
    acc = LastIterateAccountant()
    acc.load_state_dict({"history": [(SIGMA, RATE, 25)], "mechanism": "last_iterate",
                         "adaptive_trace": legacy})  # fmt: skip
    assert acc.adaptive_trace == runs
    assert acc.get_epsilon(DELTA) == _accountant(steps).get_epsilon(DELTA)
    # a name in another case, AdamW's decay not marked decoupled: read as the settings read them
    legacy["optimizer"]["values"] = ["AdamW"]
    legacy["decoupled_weight_decay"]["values"] = [False]
    acc.load_state_dict({"history": [(SIGMA, RATE, 25)], "mechanism": "last_iterate",
                         "adaptive_trace": legacy})  # fmt: skip
    assert AdaptiveSettings("AdamW", 1e-4, decoupled_weight_decay=False).decoupled_weight_decay
    assert acc.adaptive_trace == runs
    assert acc.state_dict()["adaptive_trace"]["optimizer"]["values"] == ["adamw"]


def _put(raw, i, kind, value):
    column = np.frombuffer(raw, dtype=kind).copy()
    column[i] = value
    return column.tobytes()


def _real(field, value, at=0):
    def edit(trace):
        trace[field]["values"] = _put(trace[field]["values"], at, "<f8", value)

    return edit


def _setting(field, value):
    """Whether AdaptiveSettings itself (or AdaptiveStep for noise_std) refuses ``value``."""
    base = {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.01}
    try:
        if field == "noise_std":
            AdaptiveStep(AdaptiveSettings(**base), value)
        else:
            AdaptiveSettings(**{**base, field: value})
    except (TypeError, ValueError):
        return True
    return False


_BAD_REALS = [
    ("lr", -1e-9, 7), ("lr", math.nan, 0), ("lr", math.inf, 99), ("beta1", 1.0, 0),
    ("beta2", 1.5, 0), ("eps", -1.0, 0), ("weight_decay", math.inf, 0),
    ("lr_decay", -0.5, 0), ("initial_accumulator_value", math.nan, 0),
    ("momentum_decay", -1.0, 0), ("noise_std", 0.0, 0), ("noise_std", -0.02, 0),
]  # fmt: skip


def _flag(field, raw):
    def edit(trace):
        trace[field]["values"] = raw

    return edit


def _names(values, steps):
    def edit(trace):
        trace["optimizer"] = {"values": values, "steps": np.array(steps, "<i8").tobytes()}

    return edit


def _steps(field, edit_bytes):
    def edit(trace):
        trace[field]["steps"] = edit_bytes(trace[field]["steps"])

    return edit


def _drop(field):
    def edit(trace):
        del trace[field]

    return edit


MALFORMED = [
    *[(_real(f, v, at), ValueError, rf"\['{f}'\]\['values'\]\[{at}\]") for f, v, at in _BAD_REALS],
    (_flag("amsgrad", b"\x02"), ValueError, r"\['amsgrad'\]\['values'\]\[0\].*0 or 1"),
    (_flag("centered", b"\x01"), ValueError, r"centered.*rmsprop only"),
    (_flag("decoupled_weight_decay", 1.0), TypeError, r"bytes, base64 text or a list"),
    (_names(["lbfgs"], [100]), ValueError, r"\['optimizer'\]\['values'\]\[0\].*lbfgs"),
    (_names([3], [100]), TypeError, r"\['optimizer'\]\['values'\]\[0\].*string"),
    (_names("adamw", [100]), TypeError, r"\['optimizer'\]\['values'\].*list of strings"),
    (_names(["adamw", "adam"], [50, 50]), ValueError, r"'optimizer'\]` changes at run 50"),
    (_steps("lr", lambda b: _put(b, 10, "<i8", 0)), ValueError, r"\['lr'\]\['steps'\]\[10\]"),
    (_steps("lr", lambda b: b[:-1]), ValueError, r"whole 8-byte elements"),
    (_steps("eps", lambda b: "not base64!"), ValueError, r"\['eps'\]\['steps'\].*base64"),
    (_drop("beta1"), ValueError, r"exactly the keys"),
]


@pytest.mark.parametrize("edit, error, match", MALFORMED)
def test_every_malformed_field_is_refused_and_the_accountant_is_unchanged(edit, error, match):
    acc = _accountant(_adamw_steps(100))
    state = acc.state_dict()
    before = (acc.history, acc.adaptive_trace, acc.get_epsilon(DELTA))
    bad = copy.deepcopy(state)
    edit(bad["adaptive_trace"])
    bad["history"] = [(2 * SIGMA, RATE, 100)]  # would change the epsilon if it loaded
    with pytest.raises(error, match=match):
        acc.load_state_dict(bad)
    assert (acc.history, acc.adaptive_trace, acc.get_epsilon(DELTA)) == before


@pytest.mark.parametrize("field, value, at", _BAD_REALS)
def test_what_is_refused_is_what_the_settings_refuse(field, value, at):
    """The stored form refuses a value exactly where the settings' constructor does; RMSprop's
    beta1 (its momentum) may exceed 1 in both."""
    assert _setting(field, value)
    rmsprop = AdaptiveStep(AdaptiveSettings("rmsprop", 1e-3, beta1=1.5), 0.02)
    stored = encode_adaptive_trace([(rmsprop, 3)])
    assert decode_adaptive_trace(stored, "t").runs() == [(rmsprop, 3)]


def test_an_incomplete_trace_is_refused():
    acc = _accountant(_adamw_steps(100))
    state = acc.state_dict()
    fresh = LastIterateAccountant()
    short = copy.deepcopy(state)
    short["adaptive_trace"]["beta2"]["steps"] = _put(
        short["adaptive_trace"]["beta2"]["steps"], 0, "<i8", 99
    )
    with pytest.raises(ValueError, match=r"every setting must cover the same steps"):
        fresh.load_state_dict(short)
    fewer = dict(state, adaptive_trace=_accountant(_adamw_steps(99)).state_dict()["adaptive_trace"])
    with pytest.raises(ValueError, match=r"must cover every recorded step"):
        fresh.load_state_dict(fewer)
    assert fresh.num_steps == 0 and fresh.adaptive_trace == []


def _stored_bytes(acc: LastIterateAccountant) -> int:
    return len(pickle.dumps(acc.state_dict()["adaptive_trace"]))


@pytest.mark.parametrize("changing", [1, 2])
def test_the_stored_trace_grows_by_about_16_bytes_per_changing_setting_and_step(changing):
    """A float and a run length (8 + 8 bytes) per step for each field that changes at every
    step, the other fields one run each: linear in the steps, measured between two lengths
    so that the fixed part (the keys, one run per constant field) cancels."""
    small, large = 500, 2500
    sizes = [
        _stored_bytes(_accountant(_adamw_steps(n, noise_changes=changing == 2)))
        for n in (small, large)
    ]
    per_step = (sizes[1] - sizes[0]) / (large - small)
    assert per_step <= 16 * changing + 0.1
    assert sizes[0] - small * per_step <= 3000  # the fixed part: the keys and constant runs
    with_torch = io.BytesIO()
    torch.save(_accountant(_adamw_steps(large)).state_dict(), with_torch)
    assert with_torch.tell() <= 16 * large + 20_000  # the whole state, history included


def test_take_back_trims_the_stored_trace():
    steps = _adamw_steps(40)
    acc = _accountant(steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc.take_back(15)
    assert acc.adaptive_trace == [(s, 1) for s in steps[:25]]
    assert acc.get_epsilon(DELTA) == _accountant(steps[:25]).get_epsilon(DELTA)


def test_the_summary_names_the_adaptive_optimizer():
    acc = _accountant(_adamw_steps(30))
    assert "Adaptive optimizer (adamw)" in acc.describe(DELTA)


def test_the_lists_form_names_a_column_of_another_form():
    stored = _accountant(_adamw_steps(10)).state_dict()["adaptive_trace"]
    assert adaptive_trace_as_lists(stored)["optimizer"] == {"values": ["adamw"], "steps": [10]}
    stored["optimizer"]["values"] = b"adamw"
    with pytest.raises(TypeError, match=r"stored\['optimizer'\]\['values'\].*list of strings"):
        adaptive_trace_as_lists(stored)
    stored["optimizer"]["values"] = ["adamw"]
    stored["lr"]["values"] = stored["lr"]["values"][:-3]
    with pytest.raises(ValueError, match=r"stored\['lr'\]\['values'\].*whole 8-byte"):
        adaptive_trace_as_lists(stored)


def test_loading_a_state_builds_no_object_per_step_and_answers_the_same(monkeypatch):
    """load_state_dict of N adaptive steps (a cosine schedule: a new run at every step)
    builds a constant number of AdaptiveStep and AdaptiveSettings objects, not one per step,
    and the loaded accountant's epsilon and weights equal the original's, also after both
    take more steps."""
    n = 3000
    acc = _accountant(_adamw_steps(n, noise_changes=True))
    state = acc.state_dict()
    expected = acc.get_epsilon(DELTA)
    made: list[object] = []
    for cls in (AdaptiveStep, AdaptiveSettings):
        original = cls.__post_init__

        def counted(self: object, original=original) -> None:
            made.append(self)
            original(self)

        monkeypatch.setattr(cls, "__post_init__", counted)
    fresh = LastIterateAccountant()
    fresh.load_state_dict(state)
    eps = fresh.get_epsilon(DELTA)
    assert len(made) <= 8 < n  # the first and last steps' records, not one per step
    assert eps == expected and fresh.uses_weights
    assert fresh.kept_model.weights().tolist() == acc.kept_model.weights().tolist()
    monkeypatch.undo()
    for t in range(3):
        step = AdaptiveStep(AdaptiveSettings("adamw", 2e-4 * (t + 1), weight_decay=0.01), 0.03)
        for a in (acc, fresh):
            a.replay_step(SIGMA, RATE, step)
        assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
