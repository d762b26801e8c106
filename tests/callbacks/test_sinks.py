"""Sinks: file formats, crash safety (a killed writer leaves whole lines), optional
integrations through stand-in clients, and logging."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from opacus_lastiterate.callbacks import (
    CsvSink,
    EpsilonRecord,
    JsonlSink,
    LoggingSink,
    MlflowSink,
    TensorBoardSink,
    WandbSink,
)
from opacus_lastiterate.callbacks.records import FIELDS

REPO = Path(__file__).resolve().parents[2]


def record(step: int, **kw: object) -> EpsilonRecord:
    values: dict[str, object] = dict(
        step=step, delta=1e-5, heuristic_epsilon=0.1 * step, robust_heuristic_epsilon=None,
        opacus_rdp_epsilon=0.2 * step, standard_epsilon=None, corrected_epsilon=None,
        lr=0.5, noise_multiplier=1.0, sample_rate=0.125,
    )
    values.update(kw)
    return EpsilonRecord(**values)  # type: ignore[arg-type]


def test_jsonl_round_trip_with_null_and_infinity(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "sub" / "log.jsonl")
    sink(record(1))
    sink(record(2, opacus_rdp_epsilon=math.inf, final=True))
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "sub" / "log.jsonl").read_text().splitlines()]
    assert [list(r) for r in rows] == [list(FIELDS)] * 2
    assert rows[0]["robust_heuristic_epsilon"] is None and rows[1]["opacus_rdp_epsilon"] == math.inf
    assert rows[1]["final"] is True


def test_csv_header_once_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    sink = CsvSink(path)
    sink(record(1))
    sink.close()
    sink = CsvSink(path)  # a restarted run appends without a second header
    sink(record(2, robust_heuristic_epsilon=math.inf))
    sink.close()
    rows = list(csv.DictReader(path.open()))
    assert [r["step"] for r in rows] == ["1", "2"]
    assert rows[0]["robust_heuristic_epsilon"] == "" and rows[1]["robust_heuristic_epsilon"] == "inf"
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="another header"):
        CsvSink(other)


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_rewind_drops_the_records_after_a_step_and_appends_on(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"log.{kind}"
    make = JsonlSink if kind == "jsonl" else CsvSink
    sink = make(path, flush_every=2)
    for step in (1, 2, 3, 4, 5):  # record 5 is still buffered
        sink(record(step))
    sink.rewind(3)
    sink(record(4, heuristic_epsilon=9.0))
    sink.close()
    if kind == "jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    else:
        rows = [
            {k: float(v) if k not in ("final", "sampling", "privacy_unit") else v
             for k, v in r.items() if v != ""}
            for r in csv.DictReader(path.open())
        ]
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert float(rows[-1]["heuristic_epsilon"]) == 9.0
    assert not list(tmp_path.glob("*.rewind"))


def test_buffered_records_are_written_on_flush_and_close(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "log.jsonl", flush_every=3, fsync_every=1)
    sink(record(1))
    sink(record(2))
    assert (tmp_path / "log.jsonl").read_text() == ""
    sink(record(3))
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 3
    sink(record(4))
    sink.close()
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) == 4
    with pytest.raises(ValueError, match="closed"):
        sink(record(5))
        sink.flush()
    with pytest.raises(ValueError, match="`flush_every`"):
        JsonlSink(tmp_path / "x.jsonl", flush_every=0)


_WRITER = textwrap.dedent(
    """
    import sys
    from opacus_lastiterate.callbacks import CsvSink, EpsilonRecord, JsonlSink
    sinks = [JsonlSink(sys.argv[1]), CsvSink(sys.argv[2])]
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        r = EpsilonRecord(step, 1e-5, 0.1 * step, None, 0.2 * step, None, None, 0.5, 1.0,
                          0.125)
        for s in sinks:
            s(r)
    """
)


def test_a_killed_writer_leaves_whole_lines(tmp_path: Path) -> None:
    jsonl, csv_path = tmp_path / "log.jsonl", tmp_path / "log.csv"
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(jsonl), str(csv_path)],
            stdout=subprocess.PIPE, env=env,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    text = jsonl.read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) > 10
    for line in lines:
        assert list(json.loads(line)) == list(FIELDS)
    csv_text = csv_path.read_text()
    assert csv_text.endswith("\n")
    rows = list(csv.reader(csv_text.splitlines()))
    assert rows[0] == list(FIELDS) and all(len(r) == len(FIELDS) for r in rows)
    assert sum(r == list(FIELDS) for r in rows) == 1  # one header across restarts


def test_logging_sink_labels_once_and_respects_every(caplog: pytest.LogCaptureFixture) -> None:
    sink = LoggingSink("test.privacy", every=2)
    with caplog.at_level(logging.INFO, logger="test.privacy"):
        for step in (1, 2, 3):
            sink(record(step))
        sink(record(3, final=True))
    messages = [r.getMessage() for r in caplog.records]
    labels = [m for m in messages if m.startswith("privacy column")]
    steps = [m for m in messages if m.startswith("privacy")and "step" in m and m not in labels]
    assert len(labels) == 5
    assert len(steps) == 2 and "step 2" in steps[0] and "(final)" in steps[1]
    assert "heuristic_epsilon=0.2000" in steps[0]
    with pytest.raises(TypeError, match="`logger`"):
        LoggingSink(3)  # type: ignore[arg-type]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls.append((tag, value, step))

    def flush(self) -> None:
        self.calls.append(("flush",))

    def log(self, data: dict, commit: bool = True) -> None:
        self.calls.append((data, commit))

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.calls.append((metrics, step))


def test_tensorboard_wandb_mlflow_through_stand_ins() -> None:
    writer, run, client = _Recorder(), _Recorder(), _Recorder()
    sinks = [TensorBoardSink(writer), WandbSink(run), MlflowSink(client)]
    for sink in sinks:
        sink(record(4, opacus_rdp_epsilon=math.inf))
    assert ("privacy/heuristic_epsilon", pytest.approx(0.4), 4) in writer.calls
    assert not any(c[0] == "privacy/robust_heuristic_epsilon" for c in writer.calls)
    data, commit = run.calls[0]
    assert data["privacy/step"] == 4 and commit is False
    metrics, step = client.calls[0]
    assert step == 4 and "privacy_standard_epsilon_rdp" not in metrics  # inf is not logged
    assert metrics["privacy_heuristic_epsilon"] == pytest.approx(0.4)
    with pytest.raises(TypeError, match="`writer`"):
        TensorBoardSink(object())


def test_tensorboard_sink_writes_event_files(tmp_path: Path) -> None:
    """The event files, read back with TensorBoard's own reader, hold one scalar
    ``privacy/<field>`` per computed epsilon, learning rate, noise multiplier and sample rate
    of each record, at the record's step, with the record's value (stored as float32)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = [
        record(1),
        record(2, robust_heuristic_epsilon=0.7, standard_epsilon=0.3, lr=0.25),
        record(3, corrected_epsilon=1.5, noise_multiplier=2.0, final=True),
    ]
    sink = TensorBoardSink(tmp_path / "tb")
    for r in records:
        sink(r)
    sink.close()
    expected: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        values = {**r.epsilons(), "lr": r.lr, "noise_multiplier": r.noise_multiplier,
                  "sample_rate": r.sample_rate}
        for field, value in values.items():
            if value is not None:
                expected.setdefault(f"privacy/{field}", []).append((r.step, value))
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert sorted(tags) == sorted(expected)
    for tag in tags:
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        want = [(step, float(np.float32(value))) for step, value in expected[tag]]
        assert got == want, tag


def test_a_line_torn_by_a_crash_is_cut_off_when_the_sink_reopens(tmp_path: Path) -> None:
    from opacus_lastiterate.exceptions import TruncatedRecordWarning

    path = tmp_path / "log.jsonl"
    sink = JsonlSink(path)
    sink(record(1))
    sink.close()
    with path.open("a") as f:
        f.write('{"step": 2, "heur')  # a machine crash mid-line
    with pytest.warns(TruncatedRecordWarning, match="partial last line"):
        sink = JsonlSink(path)
    sink(record(2))
    sink.close()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]
