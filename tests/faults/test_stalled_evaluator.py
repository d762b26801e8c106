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


def _same(
    records: list[EpsilonRecord], expected: list[EpsilonRecord], cold_after: int | None = None
) -> None:
    """Each step once, in order; every field equal, the heuristic at 1e-12 relative (after
    step ``cold_after``: at 1e-7)."""
    assert [(r.step, r.final) for r in records] == [(r.step, r.final) for r in expected]
    for got, want in zip(records, expected, strict=True):
        if want.heuristic_epsilon is None:
            assert got.heuristic_epsilon is None, got.step
        else:
            cold = cold_after is not None and got.step > cold_after
            rel = 1e-7 if cold else 1e-12
            assert got.heuristic_epsilon == pytest.approx(want.heuristic_epsilon, rel=rel)
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


def test_state_dict_while_stalled_returns_and_the_run_completes() -> None:
    kw = dict(robust_every=3, standard_every=4, flush_every=5)
    states: dict[str, Any] = {}

    def checkpoint(step: int, monitor: PrivacyMonitor) -> None:
        if step == 17:
            states["inline"] = monitor.state_dict()

    expected, inline = _monitored("inline", 30, after=checkpoint, **kw)
    inline.finish()
    stalled: list[Any] = []

    def stall_and_checkpoint(step: int, monitor: PrivacyMonitor) -> None:
        if step == 1:
            assert monitor.wait_ready(120)
        if step == 17:  # steps up to 15 sent, 16-17 queued
            stalled.append(_stall(monitor))
            states["process"], seconds = _within(
                STATED_BOUND + MARGIN, monitor.state_dict, stalled[0]
            )
            assert seconds <= STATED_BOUND + MARGIN

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor = _monitored("process", 30, after=stall_and_checkpoint, **kw)
        final = monitor.finish()
    assert final is not None and final.step == 30
    messages = _stall_warnings(caught)
    assert len(messages) == 1 and "no sign of life" in messages[0]
    assert stalled[0].poll() is not None
    assert states["process"] == states["inline"]
    assert states["process"]["last_record"]["step"] == 17  # every record up to it
    _same(records, expected)


def test_auto_stall_mid_run_falls_back_during_training(monkeypatch) -> None:
    """``evaluation="auto"`` with 20 ms steps (a fake clock) and two cores: the weighted
    heuristic moves to a process after a second of training. The process is stopped, and a
    later step takes longer than the stall bound: the next hand-over on the training thread
    finds it silent and falls back, before ``finish()``."""
    import opacus_lastiterate.callbacks.cadence as cadence

    monkeypatch.setattr("opacus_lastiterate.callbacks.placement.usable_cores", lambda: 2)
    now = [0.0]
    monkeypatch.setattr(cadence, "clock", lambda: now[0] + time.perf_counter())
    kw = dict(momentum=0.9, robust_every=None, standard_every=None, flush_every=100)
    steps, at, answered = 120, [], []
    stalled: list[Any] = []
    warned_at: list[int] = []

    def stall(step: int, monitor: PrivacyMonitor) -> None:
        now[0] += 0.02
        evaluator = monitor._evaluator
        if not at and getattr(evaluator, "worker", None) is not None:
            assert monitor.wait_ready(120)
            at.append(step + 25)  # some batches sent and answered by then
        if at and step == at[0]:
            stalled.append(_stall(monitor))
            answered.append(evaluator.evaluated - evaluator.in_flight)
        if at and step == at[0] + 1:
            time.sleep(STATED_BOUND + 1.0)  # a slow step: the process is silent that long
            # and, by the fake clock, a very slow one: back inline, every weighted solve fits
            # in the overhead budget of "auto" (as in the reference, which asks for each)
            now[0] += 1000.0
        if _stall_warnings(caught) and not warned_at:
            warned_at.append(step)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor = _monitored("auto", steps, after=stall, **kw)
        # the process was ended during training: finish() waits for nothing, and computes
        # the final record (robust, PLD) on this thread; a generous bound on a loaded machine
        final, _ = _within(60.0, monitor.finish, stalled[0])
    assert at and at[0] < steps and final is not None and final.step == steps
    messages = _stall_warnings(caught)
    assert len(messages) == 1 and "no sign of life" in messages[0]
    assert warned_at and warned_at[0] <= at[0] + 1 + 10  # at the next hand-over (10 steps)
    assert stalled[0].poll() is not None
    expected, inline = _monitored("inline", steps, weighted_every=1, **kw)
    inline.finish()
    # The steps the process had not answered are evaluated by a replica rebuilt from the
    # accountant's state, whose weighted heuristic starts its root finds cold: equal to the
    # solver's certified tolerance there (up to 5e-9 relative seen, compared at 1e-7), at
    # 1e-12 before; every other field (RDP, settings) is the same float.
    _same(records, expected, cold_after=answered[0])


def test_a_live_process_that_does_not_answer_in_time_is_failed(monkeypatch) -> None:
    """The progress bound: a child alive (its signs of life keep coming) that answers no
    request within ``ANSWER_WITHIN`` (set to 0 here: any wait is too long) is failed the same
    way, the warning naming it."""
    monkeypatch.setattr("opacus_lastiterate.callbacks._evaluation_process.ANSWER_WITHIN", 0.0)
    monkeypatch.setattr("opacus_lastiterate.callbacks._evaluation_process.ANSWER_SLACK", 0.0)
    kw = dict(robust_every=3, standard_every=4, flush_every=5)
    expected, inline = _monitored("inline", 12, **kw)
    inline.finish()

    def ready(step: int, monitor: PrivacyMonitor) -> None:
        if step == 1:
            assert monitor.wait_ready(120)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor = _monitored("process", 12, after=ready, **kw)
        monitor.finish()
    messages = _stall_warnings(caught)
    assert len(messages) == 1 and "answered no request" in messages[0]
    _same(records, expected)
