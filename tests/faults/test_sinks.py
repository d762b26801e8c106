"""Fault injection: a sink fails mid-run (a full disk). It is reported once, by a warning
naming it and its error, and set aside; training goes on, and the other sinks and the
accountant keep every record."""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path

import pytest

from opacus_lastiterate.callbacks import EpsilonRecord, JsonlSink, MonitorWarning, PrivacyMonitor
from tests.callbacks.conftest import DELTA, make_dp, train


class FullDisk:
    """A sink whose disk fills up at its ``fail_at``-th record (and stays full)."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls = fail_at, 0
        self.closed = False

    def __call__(self, record: EpsilonRecord) -> None:
        self.calls += 1
        if self.calls >= self.fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self.closed = True
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failing_sink_fails_alone(tmp_path: Path) -> None:
    engine, model, opt, loader = make_dp()
    kept: list[EpsilonRecord] = []
    broken = FullDisk(fail_at=15)
    path = tmp_path / "records.jsonl"
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[kept.append, broken, JsonlSink(path)], optimizer=opt,
        robust_every=None, standard_every=None, flush_every=10,
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert train(model, opt, loader, 30) == 30  # no exception from optimizer.step()
        final = monitor.finish()
    monitored = [str(w.message) for w in caught if issubclass(w.category, MonitorWarning)]
    assert len(monitored) == 1, monitored
    assert "FullDisk" in monitored[0] and "No space left on device" in monitored[0]
    assert "step 15" in monitored[0]
    assert broken.calls == 15  # set aside after its failure
    assert engine.accountant.num_steps == 30 and final is not None and final.step == 30
    assert [r.step for r in kept] == [*range(1, 31), 30]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 31)) and rows[-1]["final"]


def test_a_failing_sink_does_not_stop_training_before_the_first_flush() -> None:
    engine, model, opt, loader = make_dp()
    kept: list[EpsilonRecord] = []

    def boom(record: EpsilonRecord) -> None:
        raise RuntimeError("connection lost")

    PrivacyMonitor(engine, delta=DELTA, sinks=[boom, kept.append], optimizer=opt,
                   robust_every=None, standard_every=None, flush_every=1)  # fmt: skip
    with pytest.warns(MonitorWarning, match="boom.*connection lost"):
        train(model, opt, loader, 3)
    assert [r.step for r in kept] == [1, 2, 3]
