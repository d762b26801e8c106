"""One row per step in every sink (the final record replaces the last step's row or adds
only the values that row lacked), and the "auto" cadence of the weighted heuristic (every
step that fits in the overhead budget, and every doubling step)."""

from __future__ import annotations

import csv
import json

import pytest

from opacus_lastiterate.callbacks import cadence
from opacus_lastiterate.callbacks.cadence import Cadences, OverheadBudget
from opacus_lastiterate.callbacks.records import EpsilonRecord
from opacus_lastiterate.callbacks.sinks import CsvSink, JsonlSink, MlflowSink, TensorBoardSink


def _record(step: int, final: bool = False, **values: float) -> EpsilonRecord:
    base = dict(
        step=step, delta=1e-5, heuristic_epsilon=1.0 + step, robust_heuristic_epsilon=None,
        opacus_rdp_epsilon=2.0 + step, standard_epsilon=None, corrected_epsilon=None,
        lr=0.1, noise_multiplier=1.0, sample_rate=0.01, final=final,
    )  # fmt: skip
    base.update(values)
    return EpsilonRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("flush_every", [1, 10])
def test_file_sinks_replace_the_last_row_by_the_final_record(tmp_path, flush_every) -> None:
    jsonl = JsonlSink(tmp_path / "r.jsonl", flush_every=flush_every)
    csv_sink = CsvSink(tmp_path / "r.csv", flush_every=flush_every)
    final = _record(3, final=True, robust_heuristic_epsilon=4.5, standard_epsilon=4.9)
    for record in (_record(1), _record(2), _record(3), final):
        jsonl(record)
        csv_sink(record)
    jsonl.close()
    csv_sink.close()
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1] == final.as_dict()
    table = list(csv.reader((tmp_path / "r.csv").read_text().splitlines()))
    final_column = table[0].index("final")
    assert [r[0] for r in table[1:]] == ["1", "2", "3"] and table[-1][final_column] == "True"


def test_a_final_record_of_a_new_step_is_a_row_of_its_own(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "r.jsonl")
    sink(_record(1))
    sink(_record(2, final=True))
    sink.close()
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(r["step"], r["final"]) for r in rows] == [(1, False), (2, True)]


def test_rewind_then_final_does_not_replace_a_kept_row(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "r.jsonl")
    for step in (1, 2, 3):
        sink(_record(step))
    sink.rewind(2)
    sink(_record(2, final=True))  # step 2 is kept: after a rewind the record is a new row
    sink.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 2]


class _Writer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.calls.append((tag, value, step))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.calls.append((k, v, step))

    def flush(self) -> None:
        pass


def test_metric_sinks_add_only_the_values_the_step_lacked() -> None:
    final = _record(2, final=True, robust_heuristic_epsilon=3.5, standard_epsilon=3.9)
    for make in (lambda w: TensorBoardSink(w), lambda w: MlflowSink(w)):
        writer = _Writer()
        sink = make(writer)
        for record in (_record(1), _record(2), final):
            sink(record)
        at_2 = [(tag, step) for tag, _, step in writer.calls if step == 2]
        assert len(at_2) == len(set(at_2))  # no scalar twice at one step
        tags = {tag[len("privacy") + 1 :] for tag, _ in at_2}
        assert {"robust_heuristic_epsilon", "standard_epsilon", "heuristic_epsilon"} <= tags


def test_auto_weighted_cadence_every_step_that_fits_else_doubling(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(cadence, "clock", lambda: now[0])
    budget = OverheadBudget(0.01)
    now[0] = 10.0  # 10 s of training: 0.1 s of budget
    budget.charge("weighted", 0.001)
    assert all(budget.is_due(step, "weighted", "auto") for step in (1, 7, 99, 100, 101))
    budget.charge("weighted", 0.2)  # over the budget now: only the doubling steps
    assert [s for s in range(1, 500) if budget.is_due(s, "weighted", "auto")] == [100, 200, 400]
    # the robust and standard values keep "auto" = the doubling steps that fit
    assert not budget.is_due(7, "robust", "auto")
    assert Cadences().weighted_every == "auto"


def _momentum_cosine_rows(monkeypatch, fits: bool, steps: int = 25):
    """The records of a default monitor (``weighted_every="auto"``, flushes every 10 steps)
    over ``steps`` steps of momentum 0.9 + cosine, with an overhead budget where everything
    (``fits``) or nothing fits; and the heuristic an accountant asked at each step reports."""
    import torch

    from opacus_lastiterate.callbacks import PrivacyMonitor
    from tests.callbacks.conftest import DELTA, make_dp, train

    monkeypatch.setattr(OverheadBudget, "fits", lambda self, kind, count: fits)
    engine, model, opt, loader = make_dp(momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt,
                             flush_every=10)  # fmt: skip
    asked: list[float] = []

    def after(_: int) -> None:
        asked.append(engine.accountant.get_epsilon(DELTA))
        sched.step()

    train(model, opt, loader, steps, after=after)
    monitor.finish()
    return records, asked


def test_auto_weighted_every_row_when_the_batches_fit(monkeypatch) -> None:
    """Every flushed batch fits in the budget: every row carries the weighted heuristic,
    each the value the accountant reports at that step (to the batch's root-finding
    tolerance)."""
    records, asked = _momentum_cosine_rows(monkeypatch, True)
    rows = [r for r in records if not r.final]
    assert [r.step for r in rows] == list(range(1, 26))
    assert all(r.heuristic_epsilon is not None for r in rows)
    assert [r.heuristic_epsilon for r in rows] == pytest.approx(asked, rel=1e-7)


def test_auto_weighted_only_what_fits(monkeypatch) -> None:
    """Nothing fits in the budget: no weighted value before the final record, which has it
    (the steps 100, 200, ... would carry it whatever it costs)."""
    records, asked = _momentum_cosine_rows(monkeypatch, False)
    assert all(r.heuristic_epsilon is None for r in records if not r.final)
    assert records[-1].final and records[-1].heuristic_epsilon == pytest.approx(asked[-1], rel=1e-7)
