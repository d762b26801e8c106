"""Fault injection: malformed monitor checkpoints. Each is refused with a ValueError or
TypeError naming the field, and the monitor and its accountant are exactly as before (their
state_dicts compared); derived fields are checked against the history."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from opacus.accountants import RDPAccountant

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.optimizer_trace import trace_as_lists
from opacus_lastiterate.callbacks import PrivacyMonitor
from tests.callbacks.conftest import DELTA, make_dp, train


def _trained(steps: int, momentum: float = 0.0) -> tuple[Any, Any, dict[str, Any]]:
    engine, model, opt, loader = make_dp(momentum=momentum)
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=None,
                             standard_every=None)  # fmt: skip
    train(model, opt, loader, steps)
    return engine, monitor, monitor.state_dict()


def _target() -> tuple[Any, PrivacyMonitor]:
    """A monitor with a history of its own (30 steps), to load a state into."""
    engine, model, opt, loader = make_dp(seed=3)
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=None,
                             standard_every=None)  # fmt: skip
    train(model, opt, loader, 30)
    return engine, monitor


def _zeroed_rdp(state: dict[str, Any]) -> None:
    state["rdp"] = [0.0] * len(state["rdp"])


def _rdp_of_fewer_steps(state: dict[str, Any]) -> None:
    fewer = _trained(10)[2]
    state["rdp"] = fewer["rdp"]


def _trace_short_by_one(state: dict[str, Any]) -> None:
    trace = trace_as_lists(state["accountant"]["optimizer_trace"])
    for column in trace.values():
        column["steps"][-1] -= 1  # every setting one step short
    state["accountant"]["optimizer_trace"] = trace
    state["accountant"].pop("weighted_characteristic", None)


MALFORMED = {
    "rdp zeroed": (_zeroed_rdp, ValueError, r"state\['rdp'\]"),
    "rdp of other steps": (_rdp_of_fewer_steps, ValueError, r"state\['rdp'\]"),
    "rdp too short": (lambda s: s.update(rdp=s["rdp"][:-1]), ValueError, r"state\['rdp'\]"),
    "records_emitted not a number": (
        lambda s: s.update(records_emitted="abc"), TypeError, "records_emitted"
    ),
    "records_emitted negative": (
        lambda s: s.update(records_emitted=-1), ValueError, "records_emitted"
    ),
    "physical_steps not an int": (
        lambda s: s.update(physical_steps=2.5), TypeError, "physical_steps"
    ),
    "should_stop not a bool": (lambda s: s.update(should_stop="no"), TypeError, "should_stop"),
    "stop_reason not a str": (lambda s: s.update(stop_reason=3), TypeError, "stop_reason"),
    "no accountant": (lambda s: s.pop("accountant"), ValueError, r"state\['accountant'\]"),
    "accountant history malformed": (
        lambda s: s["accountant"].update(history=[[1.0, 2.0, 5]]), ValueError,
        r"state\['accountant'\].*history",
    ),
    "last record after the history": (
        lambda s: s["last_record"].update(step=41), ValueError, "last_record"
    ),
    "optimizer trace of 39 of 40 steps": (
        _trace_short_by_one, ValueError, "optimizer_trace.*39 step",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def saved() -> str:
    """A checkpoint of 40 steps with momentum (an optimizer trace), as JSON."""
    return json.dumps(_trained(40, momentum=0.5)[2])


@pytest.mark.parametrize("fault", list(MALFORMED))
def test_a_malformed_checkpoint_is_refused_and_changes_nothing(fault: str, saved: str) -> None:
    edit, error, field = MALFORMED[fault]
    state = json.loads(saved)  # as read back from a JSON checkpoint
    edit(state)
    engine, monitor = _target()
    before = (copy.deepcopy(monitor.state_dict()), copy.deepcopy(engine.accountant.state_dict()))
    with pytest.raises(error, match=field):
        monitor.load_state_dict(state)
    after = (monitor.state_dict(), engine.accountant.state_dict())
    assert after == before


def test_a_zeroed_rdp_vector_cannot_under_report() -> None:
    """The RDP vector of a checkpoint must be its history's: a zeroed one is refused (before
    the fix the monitor then reported the RDP epsilon of the steps after the load only)."""
    _, monitor, state = _trained(40)
    state["rdp"] = [0.0] * len(state["rdp"])
    _, restored = _target()
    with pytest.raises(ValueError, match=r"state\['rdp'\]"):
        restored.load_state_dict(state)
    state = monitor.state_dict()
    restored.load_state_dict(state)  # the intact state loads
    reference = RDPAccountant()
    reference.history = [(1.0, 1 / 8, 40)]
    assert restored.state_dict()["rdp"] == pytest.approx(state["rdp"], rel=1e-12)
    assert restored.last_record is not None
    assert restored.last_record.opacus_rdp_epsilon == pytest.approx(
        reference.get_epsilon(DELTA), rel=1e-9
    )


def test_an_incomplete_optimizer_trace_is_refused_by_the_accountant() -> None:
    """A trace that covers 39 of 40 steps would silently turn the weighted heuristic into
    the constant-rate one: the accountant refuses it and is unchanged."""
    engine, *_ = _trained(40, momentum=0.5)
    state = engine.accountant.state_dict()
    trace = trace_as_lists(state["optimizer_trace"])
    assert all(sum(c["steps"]) == 40 for c in trace.values())
    short = dict(state, optimizer_trace=trace)
    for column in trace.values():
        column["steps"][-1] -= 1  # every setting one step short
    short.pop("weighted_characteristic", None)
    fresh = LastIterateAccountant()
    fresh.step(noise_multiplier=2.0, sample_rate=0.01)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match=r"optimizer_trace'\].*39 step\(s\), the history 40"):
        fresh.load_state_dict(short)
    assert fresh.state_dict() == before
    fresh.load_state_dict(state)  # the whole trace loads, weighted
    assert fresh.uses_weights and fresh.get_epsilon(DELTA) == engine.accountant.get_epsilon(DELTA)
