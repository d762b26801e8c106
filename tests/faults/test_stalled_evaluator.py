"""Fault injection: the evaluation process stalls (SIGSTOP: alive, but it neither computes nor
answers). Training goes on, the process is killed and the monitor evaluates inline with one
``MonitorWarning`` naming the stall; ``finish()`` and ``state_dict()`` return within the
bound that ``docs/callbacks.md`` states ("Where the records are computed"), and the records
are an inline monitor's, each step once and in order.

Each test starts a child Python process (a few seconds of imports) and waits out the stall
bound once. A call that could hang runs in a thread joined with a timeout: if it does not
return in time, the child is killed (which frees the call) and the test fails."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from opacus_lastiterate.callbacks import EpsilonRecord, MonitorWarning, PrivacyMonitor
from tests.callbacks.conftest import DELTA, make_dp, train

STATED_BOUND = 5.0
"""Seconds of silence after which the monitor counts the process as failed (the docs)."""
MARGIN = 15.0
"""Seconds on top of it for the inline replay, the final record and a loaded machine."""


def _monitored(
    evaluation: str,
    steps: int,
    after: Callable[[int, PrivacyMonitor], None] | None = None,
    **kwargs: Any,
) -> tuple[list[EpsilonRecord], PrivacyMonitor]:
    """The records of ``steps`` steps of training (not finished) and the monitor; with
    ``momentum``, also under a cosine learning-rate schedule (the weighted heuristic)."""
    momentum = kwargs.pop("momentum", 0.0)
    engine, model, opt, loader = make_dp(momentum=momentum)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt,
        evaluation=evaluation, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / (steps + 1)))
    )

    def each(step: int) -> None:
        if momentum:
            scheduler.step()
        if after is not None:
            after(step, monitor)

    assert train(model, opt, loader, steps, after=each) == steps
    return records, monitor


def _within(seconds: float, call: Callable[[], Any], process: Any) -> tuple[Any, float]:
    """``call()``'s result and its duration; fails the test if it takes over ``seconds``
    (killing ``process`` first, so that the hung call can end)."""
    result: list[Any] = []
    start = time.monotonic()
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        process.kill()
        thread.join(30.0)
        pytest.fail(f"{call} did not return within {seconds:g} s of a stalled evaluation process")
    assert result, f"{call} raised"
    return result[0], time.monotonic() - start


def _stall(monitor: PrivacyMonitor) -> Any:
    """Stop the evaluation process (it stays alive); its ``Popen``."""
    process = monitor._evaluator.worker.process  # type: ignore[union-attr]
    os.kill(process.pid, signal.SIGSTOP)
    return process


def _same(records: list[EpsilonRecord], expected: list[EpsilonRecord]) -> None:
    """Each step once, in order; every field equal, the heuristic at 1e-12 relative."""
    assert [(r.step, r.final) for r in records] == [(r.step, r.final) for r in expected]
    for got, want in zip(records, expected, strict=True):
        if want.heuristic_epsilon is None:
            assert got.heuristic_epsilon is None, got.step
        else:
            assert got.heuristic_epsilon == pytest.approx(want.heuristic_epsilon, rel=1e-12)
        assert dataclasses.replace(got, heuristic_epsilon=None) == dataclasses.replace(
            want, heuristic_epsilon=None
        )


def _stall_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]


def test_a_stalled_process_near_the_end_does_not_hang_finish() -> None:
    kw = dict(robust_every=3, standard_every=4, flush_every=5)
    expected, inline = _monitored("inline", 30, **kw)
    inline.finish()
    stalled: list[Any] = []

    def stall(step: int, monitor: PrivacyMonitor) -> None:
        if step == 1:
            assert monitor.wait_ready(120)
        if step == 24:  # steps up to 20 sent (some answered), 21-30 to follow
            monitor.flush()
            stalled.append(_stall(monitor))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.monotonic()
        records, monitor = _monitored("process", 30, after=stall, **kw)
        trained = time.monotonic() - started
        final, seconds = _within(STATED_BOUND + MARGIN, monitor.finish, stalled[0])
    assert trained > 0 and final is not None and final.step == 30
    messages = _stall_warnings(caught)
    assert len(messages) == 1 and "evaluation process failed" in messages[0]
    assert "no sign of life" in messages[0]
    assert seconds <= STATED_BOUND + MARGIN
    assert stalled[0].poll() is not None  # killed, though stopped
    _same(records, expected)
    assert monitor.pending == 0


def test_state_dict_of_a_stalled_process_returns_and_the_run_completes(monkeypatch) -> None:
    """``evaluation="auto"`` with 20 ms steps (a fake clock) and two cores: the weighted
    heuristic moves to a process after a second of training; the process is stopped, and a
    checkpoint is taken at once."""
    import opacus_lastiterate.callbacks.cadence as cadence

    monkeypatch.setattr("opacus_lastiterate.callbacks.placement.usable_cores", lambda: 2)
    now = [0.0]
    monkeypatch.setattr(cadence, "clock", lambda: now[0] + time.perf_counter())
    kw = dict(momentum=0.9, robust_every=None, standard_every=None, flush_every=100)
    steps, at = 120, []
    states: dict[str, Any] = {}
    stalled: list[Any] = []

    def stall_and_checkpoint(step: int, monitor: PrivacyMonitor) -> None:
        now[0] += 0.02
        if not at and getattr(monitor._evaluator, "worker", None) is not None:
            assert monitor.wait_ready(120)
            at.append(step + 25)  # some batches sent and answered by then
        if at and step == at[0]:
            stalled.append(_stall(monitor))
            states["process"], seconds = _within(
                STATED_BOUND + MARGIN, monitor.state_dict, stalled[0]
            )
            assert seconds <= STATED_BOUND + MARGIN

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor = _monitored("auto", steps, after=stall_and_checkpoint, **kw)
        final = monitor.finish()
    assert at and at[0] < steps and final is not None and final.step == steps
    messages = _stall_warnings(caught)
    assert len(messages) == 1 and "no sign of life" in messages[0]
    assert stalled[0].poll() is not None

    def checkpoint(step: int, monitor: PrivacyMonitor) -> None:
        if step == at[0]:
            states["inline"] = monitor.state_dict()

    expected, inline = _monitored("inline", steps, after=checkpoint, weighted_every=1, **kw)
    inline.finish()
    _same(records, expected)
    got, want = dict(states["process"]), dict(states["inline"])
    assert got.pop("last_record")["step"] == want.pop("last_record")["step"] == at[0]
    assert got == want
