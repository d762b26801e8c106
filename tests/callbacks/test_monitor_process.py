"""PrivacyMonitor(evaluation="process"): the records computed in a child process are the
inline ones (float for float, up to the last bits of the weighted heuristic's BLAS dot
products in the single-threaded child); checkpoints, a dead child and the child's warnings.

Each test starts a child Python process (a few seconds of imports)."""

from __future__ import annotations

import dataclasses
import gc
import math
import warnings
from typing import Any

import pytest
import torch

from opacus_lastiterate.callbacks import (
    EpsilonRecord,
    MonitorWarning,
    PrivacyBudget,
    PrivacyMonitor,
)
from tests.callbacks.conftest import DELTA, make_dp, train


def _run(
    evaluation: str,
    steps: int,
    *,
    momentum: float = 0.0,
    schedule: bool = False,
    sigma: float = 1.0,
    after: Any = None,
    **kwargs: Any,
) -> tuple[list[EpsilonRecord], PrivacyMonitor, Any, Any, Any]:
    """Records of ``steps`` steps (not finished), the monitor and (model, optimizer, loader)."""
    engine, model, opt, loader = make_dp(momentum=momentum, sigma=sigma)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, evaluation=evaluation,  # type: ignore[arg-type]
        **kwargs,
    )
    assert monitor.wait_ready(120)
    scheduler = None
    if schedule:  # cosine decay of the learning rate
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * s / (steps + 1)))
        )

    def each(step: int) -> None:
        if scheduler is not None:
            scheduler.step()
        if after is not None:
            after(step, monitor)

    train(model, opt, loader, steps, after=each)
    return records, monitor, model, opt, loader


def test_plain_sgd_records_equal_inline_exactly() -> None:
    kw = dict(robust_every=3, standard_every=4, flush_every=7)
    expected, inline, *_ = _run("inline", 30, **kw)
    inline.finish()
    records, monitor, *_ = _run("process", 30, **kw)
    assert monitor._evaluator.worker is not None
    final = monitor.finish()
    assert monitor._evaluator.worker is None  # stopped
    assert records == expected and len(records) == 31
    assert final is not None and final.final and final.robust_heuristic_epsilon is not None
    assert sum(r.robust_heuristic_epsilon is not None for r in records) == 10 + 1


def test_momentum_and_cosine_schedule_records_equal_inline() -> None:
    kw = dict(momentum=0.9, schedule=True, weighted_every=50, flush_every=20)
    # the default cadences ("auto") are "doubling" in the child, which has no overhead to keep
    # within; inline, "auto" would depend on the machine's speed
    expected, inline, *_ = _run("inline", 120, robust_every="doubling", standard_every="doubling", **kw)
    inline.finish()
    records, monitor, *_ = _run("process", 120, **kw)
    assert monitor.robust_every == monitor.standard_every == "auto"
    monitor.finish()
    # The child runs single-threaded BLAS (OMP/OPENBLAS/MKL_NUM_THREADS=1 unless set): the
    # weighted heuristic's long dot products may round differently in the last bits there.
    assert len(records) == len(expected)
    for got, want in zip(records, expected, strict=True):
        if want.heuristic_epsilon is None:
            assert got.heuristic_epsilon is None
        else:
            assert got.heuristic_epsilon == pytest.approx(want.heuristic_epsilon, rel=1e-12)
        assert dataclasses.replace(got, heuristic_epsilon=None) == dataclasses.replace(
            want, heuristic_epsilon=None
        )
    weighted = [r.step for r in records if r.heuristic_epsilon is not None and not r.final]
    assert weighted == [50, 100]  # the weighted heuristic, on its cadence
    assert [r.step for r in records if r.standard_epsilon is not None] == [100, 120]
    assert len({r.lr for r in records}) > 100  # the schedule moved the learning rate


def test_state_dict_mid_run_equals_inline_and_resume_continues() -> None:
    states: dict[str, dict[str, Any]] = {}

    def checkpoint_and_rewind(evaluation: str) -> Any:
        def after(step: int, monitor: PrivacyMonitor) -> None:
            if step == 15:
                states[evaluation] = monitor.state_dict()
            if step == 20:  # a crash after step 20: resume from the checkpoint at 15
                monitor.load_state_dict(states[evaluation])
        return after

    kw = dict(robust_every=5, standard_every=5, flush_every=4)
    expected, inline, *_ = _run("inline", 30, after=checkpoint_and_rewind("inline"), **kw)
    inline.finish()
    records, monitor, *_ = _run("process", 30, after=checkpoint_and_rewind("process"), **kw)
    assert states["process"] == states["inline"]
    assert states["process"]["last_record"]["step"] == 15  # drained: every record up to it
    monitor.finish()
    # before the rewind: the records back by then (those still in flight are dropped, as
    # queued ones are); after it, the same records (the heuristic: both replicas are rebuilt
    # cold from the checkpoint, in two processes, so to the root finder's tolerance)
    rewind = len(records) - 11  # steps 16-25 and the final record follow the rewind
    assert records[:rewind] == expected[:rewind] and rewind >= 15
    resumed, want = records[rewind:], expected[-len(records) + rewind:]
    assert [r.step for r in resumed] == list(range(16, 26)) + [25]
    for got, exp in zip(resumed, want, strict=True):
        assert got.heuristic_epsilon == pytest.approx(exp.heuristic_epsilon, rel=1e-12)
        assert _without_heuristic(got) == _without_heuristic(exp)


def test_killed_child_falls_back_inline_with_one_warning() -> None:
    kw = dict(robust_every=3, standard_every=4, flush_every=5)
    expected, inline, *_ = _run("inline", 30, **kw)
    inline.finish()
    in_flight: list[int] = []

    def kill(step: int, monitor: PrivacyMonitor) -> None:
        if step == 12:  # steps up to 10 sent, 11-12 sent now: killed before most answers
            queue, monitor._queue = monitor._queue, []
            monitor._ready.extend(monitor._evaluator.evaluate(queue))  # sent, not collected
            in_flight.append(monitor._evaluator.in_flight)
            monitor._evaluator.worker.process.kill()
            monitor._evaluator.worker.process.wait()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor, *_ = _run("process", 30, after=kill, **kw)
        monitor.finish()
    fallbacks = [w for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(fallbacks) == 1 and "evaluation process failed" in str(fallbacks[0].message)
    assert monitor._evaluator.worker is None and monitor.pending == 0 and in_flight[0] >= 2
    assert [r.step for r in records] == [r.step for r in expected]
    # the replica rebuilt at the fallback solves cold: the heuristic to the root finder's
    # tolerance; every other field (RDP, robust, PLD, settings) is the same float
    for got, want in zip(records, expected, strict=True):
        assert got.heuristic_epsilon == pytest.approx(want.heuristic_epsilon, rel=1e-9)
        assert _without_heuristic(got) == _without_heuristic(want)


def _without_heuristic(record: EpsilonRecord) -> dict[str, Any]:
    d = record.as_dict()
    del d["heuristic_epsilon"]
    return d


def test_child_warnings_are_reissued_and_process_mode_rejects_a_budget() -> None:
    engine, *_ = make_dp()
    with pytest.raises(ValueError, match="evaluation"):
        PrivacyMonitor(engine, delta=DELTA, evaluation="thread")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        PrivacyMonitor(engine, delta=DELTA, evaluation="process", budget=PrivacyBudget(1.0))
    # the replica's zero-noise warning is raised while evaluating: in the child
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor, *_ = _run("process", 3, sigma=0.0, flush_every=None)
        monitor._drain()
        monitor.flush()
    assert [r.step for r in records] == [1, 2, 3] and math.isinf(records[-1].opacus_rdp_epsilon)
    zero_noise = [
        str(w.message) for w in caught if str(w.message).startswith("LastIterateAccountant:")
    ]
    # one from the training accountant, one from the child's replica, re-issued here
    assert len(zero_noise) == 2 and all("noise_multiplier=0" in m for m in zero_noise)
    assert not any(issubclass(w.category, MonitorWarning) for w in caught)
    # the child is stopped when the monitor is garbage-collected
    process = monitor._evaluator.worker.process
    monitor.detach()
    del monitor
    gc.collect()
    assert process.wait(timeout=30) == 0


def test_a_process_that_cannot_restart_counts_each_step_once(monkeypatch) -> None:
    """finish() stops the child; when training goes on and a new child cannot be started,
    the steps handed over are evaluated inline once (not replayed twice), as inline gives."""
    from opacus_lastiterate.callbacks import _evaluation_process

    expected, inline, *_ = _run("inline", 10, flush_every=5)
    inline_final = inline.finish()
    _, monitor, model, opt, loader = _run("process", 10, flush_every=5)
    monitor.finish()

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("no process today")

    monkeypatch.setattr(_evaluation_process, "EvaluationWorker", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, opt, loader, 10)
        final = monitor.finish()
    assert any(issubclass(w.category, MonitorWarning) for w in caught)
    assert final is not None and final.step == 20
    _, reference, m2, o2, l2 = _run("inline", 10, flush_every=5)
    reference.finish()
    train(m2, o2, l2, 10)
    want = reference.finish()
    assert want is not None and final.heuristic_epsilon == pytest.approx(
        want.heuristic_epsilon, rel=1e-12
    )
    assert inline_final is not None and expected[-1].final


# -- evaluation="auto" (the default) ----------------------------------------------------------


def _ticking(monkeypatch: Any, seconds: float) -> Any:
    """The overhead budget's clock, moved on ``seconds`` per step besides the real time (a
    step that much longer; the evaluation's time is real)."""
    import time

    from opacus_lastiterate.callbacks import cadence

    now = [0.0]
    monkeypatch.setattr(cadence, "clock", lambda: now[0] + time.perf_counter())

    def tick(step: int, monitor: PrivacyMonitor | None = None) -> None:
        now[0] += seconds

    return tick


_AUTO = dict(momentum=0.9, schedule=True, robust_every=None, standard_every=None, flush_every=100)


def test_auto_moves_the_weighted_heuristic_to_a_process_and_back_for_a_budget(
    monkeypatch,
) -> None:
    """20 ms steps: a weighted solve (2 ms until measured) does not fit in 1% of a step, so
    after a second of training the steps go to a process, which logs the heuristic at every
    step, as an inline monitor asked for it at every step does; a budget set later brings
    the evaluation back to the training thread."""
    monkeypatch.setattr("opacus_lastiterate.callbacks.placement.usable_cores", lambda: 2)
    expected, inline, *_ = _run("inline", 120, weighted_every=1, **_AUTO)
    inline.finish()
    offloaded_at: list[int] = []

    def after(step: int, monitor: PrivacyMonitor) -> None:
        tick(step, monitor)
        if monitor._evaluator.offloads and not offloaded_at:
            offloaded_at.append(step)

    tick = _ticking(monkeypatch, 0.02)
    records, monitor, model, opt, loader = _run("auto", 120, after=after, **_AUTO)
    assert 0 < offloaded_at[0] <= 50  # after 1 s of training (OFFLOAD_AFTER), before a flush
    assert monitor.wait_ready(120)
    monitor.flush(wait=True)
    assert len(records) == len(expected) - 1  # every step's record, the final one to come
    for got, want in zip(records, expected, strict=False):
        assert got.heuristic_epsilon == pytest.approx(want.heuristic_epsilon, rel=1e-12)
        assert _without_heuristic(got) == _without_heuristic(want)
    monitor.budget = PrivacyBudget(1e9)  # the guard needs the training thread
    assert not monitor._evaluator.offloads and monitor.pending == 0
    train(model, opt, loader, 5, after=tick)
    final = monitor.finish()
    assert [r.step for r in records] == list(range(1, 126)) + [125]
    assert final is not None and final.final and final.heuristic_epsilon is not None


def test_auto_stays_inline_with_one_core_or_a_budget(monkeypatch) -> None:
    tick = _ticking(monkeypatch, 0.02)
    for cores, budget in ((1, None), (2, PrivacyBudget(1e9))):
        monkeypatch.setattr("opacus_lastiterate.callbacks.placement.usable_cores", lambda: cores)
        records, monitor, *_ = _run("auto", 60, after=tick, budget=budget, **_AUTO)
        assert not monitor._evaluator.offloads
        monitor.finish()
        # inline, the weighted heuristic is on the steps that fit in the budget only: 1% of a
        # 20 ms step is 0.2 ms, below a weighted query (0.3 ms or more), so not every step
        # (how many fit depends on the machine's speed; a process would give all 60)
        steps = [r for r in records if not r.final]
        assert 0 < sum(r.heuristic_epsilon is not None for r in steps) < len(steps) == 60


def test_auto_does_not_wait_at_the_end_for_a_process_still_starting(monkeypatch) -> None:
    """A run that ends before its evaluation process has started: the process is stopped,
    its steps evaluated inline, each once and without a warning."""
    from opacus_lastiterate.callbacks import _evaluation_process

    monkeypatch.setattr("opacus_lastiterate.callbacks.placement.usable_cores", lambda: 2)
    monkeypatch.setattr(_evaluation_process.EvaluationWorker, "starting", property(lambda s: True))
    tick = _ticking(monkeypatch, 0.02)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records, monitor, *_ = _run("auto", 70, after=tick, **_AUTO)
        assert monitor._evaluator.offloads
        process = monitor._evaluator.worker.process
        final = monitor.finish()
    assert not any(issubclass(w.category, MonitorWarning) for w in caught)
    assert process.wait(timeout=30) is not None  # stopped
    assert [r.step for r in records] == list(range(1, 71)) + [70]
    assert final is not None and final.heuristic_epsilon is not None
