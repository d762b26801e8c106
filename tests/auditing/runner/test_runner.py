"""The many-run runner: coins, records, resume after SIGKILL, truncation, config refusal."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from opacus_lastiterate.analysis.audit import (
    AuditResult,
    HeldOutSplit,
    NaiveMax,
    audit_clopper_pearson,
    audit_gaussian_dp,
)
from opacus_lastiterate.auditing.runner import (
    AuditRunner,
    RunRecord,
    TrainFunction,
    audit_records,
    read_records,
    run_audit,
)
from opacus_lastiterate.auditing.runner.contract import run_assignment
from opacus_lastiterate.exceptions import TruncatedRecordWarning
from tests.analysis._reference import gaussian_mechanism_epsilon

DELTA = 1e-5


# Cheap, deterministic-but-random "training": top-level so that they pickle (process pool)
# and can be imported by the subprocess of the kill test under the same qualified names.
def gaussian_train(include_canary: bool, seed: int) -> float:
    """A 'model' whose value is N(0, 1) from the seed, shifted by 2 with the canary."""
    return float(np.random.default_rng(seed).normal()) + (2.0 if include_canary else 0.0)


def slow_gaussian_train(include_canary: bool, seed: int) -> float:
    """:func:`gaussian_train`, slow enough to be killed mid-audit."""
    time.sleep(0.03)
    return gaussian_train(include_canary, seed)


def identity_score(model: float) -> float:
    return model


def nan_score(model: float) -> float:
    return float("nan")


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _records(path: Path) -> list[RunRecord]:
    return list(read_records(path).records)


@pytest.fixture
def single_thread_torch() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _three_arguments(include_canary: bool, seed: int, lr: float) -> float:
    return 0.0


def _keyword_only_seed(include_canary: bool, *, seed: int) -> float:
    return 0.0


def test_train_protocol_is_satisfied_by_a_plain_function() -> None:
    assert isinstance(gaussian_train, TrainFunction)
    accepted = (gaussian_train, _ShiftedTrainer(1.0), functools.partial(_three_arguments, lr=0.1))
    for train in accepted:
        AuditRunner(train, identity_score, num_runs=2, workers=0)  # accepted


@pytest.mark.parametrize(
    ("train", "score", "match"),
    [
        (len, identity_score, r"`train` must be callable as train\(include_canary, seed\).*len"),
        (identity_score, identity_score, r"`train` must be callable as train\(include_canary"),
        (_three_arguments, identity_score, "`train` .*missing a required argument: 'lr'"),
        (_keyword_only_seed, identity_score, "`train` .*too many positional arguments"),
        (3, identity_score, r"`train` must be callable as train\(include_canary, seed\), got 3"),
        (gaussian_train, gaussian_train, r"`score` must be callable as score\(model\) with 1"),
        (gaussian_train, len, None),  # len(model): one positional argument, accepted
        (gaussian_train, max, None),  # no signature to inspect: accepted
    ],
)
def test_train_and_score_signatures_are_checked_at_the_runner(train, score, match) -> None:
    if match is None:
        AuditRunner(train, score, num_runs=2, workers=0)
        return
    with pytest.raises(TypeError, match=match):
        AuditRunner(train, score, num_runs=2, workers=0)


def test_coins_are_fair_seeded_and_prefix_stable() -> None:
    coins = np.array([run_assignment(3, i)[1] for i in range(4000)])
    assert abs(coins.sum() - 2000) < 4 * np.sqrt(1000)  # 4 standard deviations
    assert 0 < coins[:20].sum() < 20
    seeds = [run_assignment(3, i)[0] for i in range(4000)]
    assert len(set(seeds)) > 3990 and all(0 <= s < 2**31 for s in seeds)
    assert run_assignment(3, 17) == run_assignment(3, 17) != run_assignment(4, 17)
    short = AuditRunner(gaussian_train, identity_score, num_runs=10, seed=3, workers=0)
    long = AuditRunner(gaussian_train, identity_score, num_runs=30, seed=3, workers=0)
    assert short.assignments() == long.assignments()[:10]


def test_coins_and_seeds_are_recorded_and_passed_to_train(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    records = AuditRunner(
        gaussian_train, identity_score, num_runs=40, seed=5, path=path, workers=0, progress=False
    ).run()
    assert [r.index for r in records.records] == list(range(40))
    for rec in records.records:
        assert (rec.seed, rec.include_canary) == run_assignment(5, rec.index)
        assert rec.score == gaussian_train(rec.include_canary, rec.seed)
    assert _records(path) == list(records.records)
    header, *lines = (json.loads(line) for line in _lines(path))
    assert header["type"] == "header" and header["config"]["seed"] == 5
    assert {d["include_canary"] for d in lines} == {True, False}


def _geometric_ranks(n: int, growth: float = 1.25) -> list[int]:
    """{0} U {round(growth^i)} below n: the documented rank grid of RankGridBonferroni."""
    ranks, x = {0}, 1.0
    while round(x) < n:
        ranks.add(round(x))
        x *= growth
    return sorted(ranks)


def _cp_epsilon(fp: int, n_out: int, fn: int, n_in: int, significance: float) -> float:
    """max(log((1 - delta - a) / b), log((1 - delta - b) / a), 0) for the exact (Clopper-
    Pearson) upper bounds a, b on FPR and FNR at significance / 2 each, from scipy."""
    from scipy import stats

    def upper(k: int, n: int) -> float:
        return float(stats.binomtest(k, n).proportion_ci(1 - significance, "exact").high)

    a, b = upper(fp, n_out), upper(fn, n_in)
    return max(math.log((1 - DELTA - a) / b), math.log((1 - DELTA - b) / a), 0.0)


def _independent_cp_audit(ins: list[float], outs: list[float], confidence: float = 0.95) -> float:
    """Epsilon of the documented default audit, from scratch: thresholds just
    above the (c+1)-th largest out-score and at the (c+1)-th smallest in-score for c on the
    rank grid, each bound at significance (1 - confidence) / (number of thresholds), the
    largest bound kept. Scores without ties (continuous)."""
    outs_desc, ins_asc = sorted(outs, reverse=True), sorted(ins)
    thresholds = [np.nextafter(outs_desc[c], np.inf) for c in _geometric_ranks(len(outs))]
    thresholds += [ins_asc[c] for c in _geometric_ranks(len(ins))]
    significance = (1 - confidence) / len(thresholds)
    return max(
        _cp_epsilon(sum(o >= t for o in outs), len(outs), sum(i < t for i in ins), len(ins),
                    significance)
        for t in thresholds
    )


def test_runner_audit_equals_the_audit_of_the_recorded_scores(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    result = run_audit(
        gaussian_train, identity_score, num_runs=200, delta=DELTA, seed=1, path=path,
        workers=0, progress=False,
    )  # fmt: skip
    assert isinstance(result, AuditResult) and result.kind == "bound" and result.is_bound
    recorded = _records(path)
    # the recorded scores are those of the runs (rescored independently)
    for r in recorded:
        assert r.score == identity_score(gaussian_train(r.include_canary, r.seed))
    ins = [r.score for r in recorded if r.include_canary]
    outs = [r.score for r in recorded if not r.include_canary]
    assert len(ins) + len(outs) == 200 and len(set(ins + outs)) == 200
    # the bound is the Clopper-Pearson audit of those scores (scipy, from scratch) ...
    assert result.epsilon == pytest.approx(_independent_cp_audit(ins, outs), rel=1e-9)
    assert result.counts.false_positives == sum(o >= result.threshold for o in outs)
    assert result.counts.false_negatives == sum(i < result.threshold for i in ins)
    assert _cp_epsilon(
        result.counts.false_positives, len(outs), result.counts.false_negatives, len(ins),
        0.05 / (len(_geometric_ranks(len(outs))) + len(_geometric_ranks(len(ins)))),
    ) == pytest.approx(result.epsilon, rel=1e-9)
    # ... positive, and below the true epsilon of the shift-2 Gaussian mechanism
    assert 0.0 < result.epsilon < gaussian_mechanism_epsilon(2.0, DELTA)
    assert result == audit_clopper_pearson(ins, outs, delta=DELTA)
    # re-audit from the file with another strategy / confidence / method, training nothing
    split = HeldOutSplit(seed=3)
    assert audit_records(path, delta=DELTA, confidence=0.9, threshold_strategy=split) == (
        audit_clopper_pearson(ins, outs, delta=DELTA, confidence=0.9, threshold_strategy=split)
    )
    gdp = audit_records(path, delta=DELTA, method="gaussian-dp")
    assert gdp == audit_gaussian_dp(ins, outs, delta=DELTA) and gdp.kind == "estimate"
    naive = audit_records(path, delta=DELTA, threshold_strategy=NaiveMax())
    assert not naive.statistically_valid
    first = [r for r in recorded if r.index < 50]
    first_in = [r.score for r in first if r.include_canary]
    first_out = [r.score for r in first if not r.include_canary]
    head = audit_records(path, delta=DELTA, num_runs=50)
    assert head == audit_clopper_pearson(first_in, first_out, delta=DELTA)
    assert head.epsilon == pytest.approx(_independent_cp_audit(first_in, first_out), rel=1e-9)


def test_resume_after_sigkill_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    num_runs, seed = 40, 7
    killed = tmp_path / "killed.jsonl"
    child = (
        "import importlib, json, sys\n"
        f"sys.path[:0] = json.loads({json.dumps(json.dumps(sys.path))})\n"
        f"mod = importlib.import_module({slow_gaussian_train.__module__!r})\n"
        "from opacus_lastiterate.auditing.runner import AuditRunner\n"
        f"AuditRunner(mod.slow_gaussian_train, mod.identity_score, num_runs={num_runs}, "
        f"seed={seed}, path={str(killed)!r}, workers=0, progress=False).run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (killed.exists() and len(_lines(killed)) >= 1 + 5):
            assert proc.poll() is None, "the child finished or crashed before it was killed"
            assert time.monotonic() < deadline, "the child wrote no records"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:  # pragma: no cover
            proc.kill()
            proc.wait()
    done = len(read_records(killed))
    assert 5 <= done < num_runs

    resumed = AuditRunner(
        slow_gaussian_train, identity_score, num_runs=num_runs, seed=seed, path=killed,
        workers=0, progress=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedRecordWarning)  # a kill mid-write is allowed
        records = resumed.run()
    assert resumed.last_trained == num_runs - done
    fresh = tmp_path / "fresh.jsonl"
    reference = AuditRunner(
        gaussian_train, identity_score, num_runs=num_runs,
        seed=seed, path=fresh, workers=0, progress=False,
    ).run()  # fmt: skip
    assert records.records == reference.records
    assert _records(killed) == _records(fresh)  # record by record
    assert len(_lines(killed)) == 1 + num_runs  # no duplicates
    assert resumed.audit(delta=DELTA) == audit_records(fresh, delta=DELTA)
    # a finished audit resumes to a no-op
    again = AuditRunner(
        slow_gaussian_train, identity_score, num_runs=num_runs, seed=seed, path=killed,
        workers=0, progress=False,
    )  # fmt: skip
    assert again.run().records == reference.records and again.last_trained == 0


def test_truncated_last_line_is_detected_dropped_and_rerun(tmp_path: Path) -> None:
    path, fresh = tmp_path / "runs.jsonl", tmp_path / "fresh.jsonl"
    kwargs = {"num_runs": 12, "seed": 2, "workers": 0, "progress": False}
    reference = AuditRunner(gaussian_train, identity_score, path=fresh, **kwargs).run()  # type: ignore[arg-type]
    AuditRunner(gaussian_train, identity_score, path=path, **kwargs).run()  # type: ignore[arg-type]
    data = path.read_bytes()
    cut = data.rstrip(b"\n").rfind(b"\n") + 1 + 25  # keep 25 bytes of the last record
    path.write_bytes(data[:cut])
    with pytest.warns(TruncatedRecordWarning, match="partial last line"):
        assert len(read_records(path)) == 11
    assert path.read_bytes() == data[:cut]  # reading alone does not repair
    runner = AuditRunner(gaussian_train, identity_score, path=path, **kwargs)  # type: ignore[arg-type]
    with pytest.warns(TruncatedRecordWarning, match="dropped a partial last line"):
        records = runner.run()
    assert runner.last_trained == 1
    assert records.records == reference.records
    assert path.read_bytes().endswith(b"\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRecordWarning)
        assert _records(path) == list(reference.records)


def test_a_corrupted_complete_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    AuditRunner(
        gaussian_train, identity_score, num_runs=6, path=path, workers=0, progress=False
    ).run()
    lines = _lines(path)
    lines[3] = lines[3][:10] + "#" + lines[3][11:]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="line 4 is a corrupted run record"):
        read_records(path)
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="not an audit record file"):
        read_records(path)


def test_a_file_of_another_configuration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    AuditRunner(
        gaussian_train, identity_score, num_runs=6, seed=0, path=path, workers=0, progress=False
    ).run()
    before = path.read_bytes()
    others = [
        {"train": gaussian_train, "seed": 1, "config": None},
        {"train": slow_gaussian_train, "seed": 0, "config": None},
        {"train": gaussian_train, "seed": 0, "config": {"lr": 0.1}},
    ]
    for other in others:
        runner = AuditRunner(
            other["train"], identity_score, num_runs=6, seed=other["seed"], path=path,  # type: ignore[arg-type]
            workers=0, progress=False, config=other["config"],  # type: ignore[arg-type]
        )  # fmt: skip
        with pytest.raises(ValueError, match="another configuration.*refusing to resume"):
            runner.run()
    assert path.read_bytes() == before
    seed_only = AuditRunner(
        gaussian_train, identity_score, num_runs=6, seed=1, path=path, workers=0, progress=False
    )
    with pytest.raises(ValueError, match=r"Differences: seed: 0 -> 1\. Use another path"):
        seed_only.run()
    # the same configuration with more runs extends the audit
    more = AuditRunner(
        gaussian_train, identity_score, num_runs=9, seed=0, path=path, workers=0, progress=False
    )
    assert len(more.run()) == 9 and more.last_trained == 3


def _shifted_train(shift: float):
    def train(include_canary: bool, seed: int) -> float:
        return gaussian_train(include_canary, seed) + shift

    return train


class _ShiftedTrainer:
    def __init__(self, shift: float) -> None:
        self.shift = shift

    def __call__(self, include_canary: bool, seed: int) -> float:
        return gaussian_train(include_canary, seed) + self.shift


@pytest.mark.parametrize("make", [_shifted_train, _ShiftedTrainer])
def test_closures_and_instances_with_other_state_are_refused(tmp_path: Path, make) -> None:
    path = tmp_path / "runs.jsonl"
    AuditRunner(make(0.0), identity_score, num_runs=4, path=path, workers=0, progress=False).run()
    same = AuditRunner(make(0.0), identity_score, num_runs=5, path=path, workers=0, progress=False)
    assert len(same.run()) == 5 and same.last_trained == 1  # same state: resumes
    other = AuditRunner(make(50.0), identity_score, num_runs=6, path=path, workers=0, progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        other.run()


def test_process_pool_gives_the_records_of_a_serial_run(tmp_path: Path) -> None:
    serial = AuditRunner(
        gaussian_train, identity_score, num_runs=16, seed=4, workers=0, progress=False
    )
    pooled = AuditRunner(
        gaussian_train, identity_score, num_runs=16, seed=4, workers=2, progress=True,
        path=tmp_path / "pool.jsonl",
    )  # fmt: skip
    assert pooled.run().records == serial.run().records
    assert _records(tmp_path / "pool.jsonl") == list(serial.run().records)


def test_unpicklable_functions_are_refused_for_the_pool() -> None:
    runner = AuditRunner(lambda c, s: 0.0, identity_score, num_runs=4, workers=2, progress=False)
    with pytest.raises(TypeError, match="`train` must be picklable.*workers=0"):
        runner.run()
    ok = AuditRunner(lambda c, s: float(s), identity_score, num_runs=4, workers=0, progress=False)
    assert len(ok.run()) == 4


_SCRIPT = """\
import sys
sys.path[:0] = {sys_path!r}
from opacus_lastiterate.auditing.runner import AuditRunner


def train(include_canary, seed):
    return float(seed % 7) + include_canary


def score(model):
    return model


{body}
"""
_RUN = "AuditRunner(train, score, num_runs=4, path='runs.jsonl', workers=1, progress=False).run()"


@pytest.mark.slow  # two interpreters import torch (the script and its worker)
@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_is_told_so(tmp_path: Path, guarded: bool) -> None:
    """The documented sample pasted into a script: spawned workers import the script and
    start the audit again; the error says so, not that the record file is in use."""
    body = f'if __name__ == "__main__":\n    {_RUN}\n    print("done")' if guarded else _RUN
    script = tmp_path / "my_audit.py"
    script.write_text(_SCRIPT.format(sys_path=sys.path, body=body))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    if guarded:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "done" and len(read_records(tmp_path / "runs.jsonl")) == 4
        return
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the worker processes stopped while importing")
    assert str(script) in last and 'if __name__ == "__main__":' in last
    assert "is in use by another process" not in proc.stderr
    assert "AuditRunner.run() was called while this worker process was importing" in proc.stderr
    assert len(read_records(tmp_path / "runs.jsonl")) == 0


def test_an_audit_started_while_a_worker_imports_the_script_stops_that_worker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The worker side of the test above, in this process: ``multiprocessing`` marks a spawned
    child as ``_inheriting`` while it imports the parent's main script."""
    import multiprocessing

    from opacus_lastiterate.auditing.runner import process_pool

    runner = AuditRunner(gaussian_train, identity_score, num_runs=2, workers=0, progress=False)
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        runner.run()
    assert exit_info.value.code == process_pool._MAIN_REIMPORTED_EXIT
    assert 'must sit under `if __name__ == "__main__":`' in capsys.readouterr().err
    assert runner.last_trained == 0
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", False)
    assert len(runner.run()) == 2


def _kill_own_worker(include_canary: bool, seed: int) -> float:
    os.kill(os.getpid(), signal.SIGKILL)
    return 0.0  # pragma: no cover


def test_a_killed_pool_worker_is_named_as_such(tmp_path: Path) -> None:
    runner = AuditRunner(_kill_own_worker, identity_score, num_runs=2, workers=1, progress=False)
    with pytest.raises(RuntimeError, match="a worker process was killed by SIGKILL.*resume"):
        runner.run()


def test_progress_bar_degrades_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    runner = AuditRunner(gaussian_train, identity_score, num_runs=4, workers=0, progress=True)
    assert len(runner.run()) == 4


def test_ray_backend_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    runner = AuditRunner(gaussian_train, identity_score, num_runs=4, backend="ray", progress=False)
    with pytest.raises(ImportError, match=r"pip install opacus-lastiterate\[ray\]"):
        runner.run()


def _never_called(include_canary: bool, seed: int) -> float:
    raise AssertionError("trained although the arguments were invalid")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_runs": 1}, ValueError, "`num_runs` must be an integer >= 2, got 1"),
        ({"num_runs": 2.0}, TypeError, "`num_runs` must be an integer"),
        ({"seed": -1}, ValueError, "`seed` must be an integer >= 0, got -1"),
        ({"workers": -2}, ValueError, "`workers` must be an integer >= 0, got -2"),
        ({"backend": "dask"}, ValueError, "`backend` must be 'process' or 'ray', got 'dask'"),
        ({"config": {"x": object()}}, TypeError, "`config` must contain JSON data"),
        ({"threads_per_worker": 0}, ValueError, "`threads_per_worker` must be an integer >= 1"),
        ({"path": 3}, TypeError, "`path` must be a path or None"),
        ({"cpus_per_run": 2}, ValueError, "`cpus_per_run` applies to backend='ray' only"),
        ({"gpus_per_run": 1}, ValueError, "`gpus_per_run` applies to backend='ray' only"),
        ({"max_retries": 0}, ValueError, "`max_retries` applies to backend='ray' only"),
        ({"backend": "ray", "cpus_per_run": -1}, ValueError, r"`cpus_per_run` must be in \[0, "),
        ({"backend": "ray", "gpus_per_run": "1"}, TypeError, "`gpus_per_run` must be a real"),
        ({"backend": "ray", "max_retries": -1}, ValueError, "`max_retries` must be an integer >="),
    ],
)
def test_runner_arguments_are_validated(kwargs: dict, error: type, match: str) -> None:
    args = {"num_runs": 4, "workers": 0, "progress": False} | kwargs
    with pytest.raises(error, match=match):
        AuditRunner(_never_called, identity_score, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delta": 1.5}, ValueError, r"`delta` must be in \[0, 1\), got 1.5"),
        ({"delta": 0.0, "method": "gaussian-dp"}, ValueError, r"`delta` must be in \(0, 1\)"),
        ({"confidence": 1.0}, ValueError, r"`confidence` must be in \(0, 1\), got 1.0"),
        ({"method": "bayes"}, ValueError, "`method` must be 'clopper-pearson' or 'gaussian-dp'"),
        ({"threshold_strategy": "max"}, TypeError, "`threshold_strategy` must be a Threshold"),
    ],
)
def test_audit_arguments_are_checked_before_training(kwargs: dict, error: type, match: str) -> None:
    args = {"num_runs": 4, "delta": DELTA, "workers": 0, "progress": False} | kwargs
    with pytest.raises(error, match=match):
        run_audit(_never_called, identity_score, **args)  # type: ignore[arg-type]


def test_a_non_finite_score_names_the_run() -> None:
    runner = AuditRunner(gaussian_train, nan_score, num_runs=4, workers=0, progress=False)
    with pytest.raises(ValueError, match="`score of run 0` must be a number, got NaN"):
        runner.run()


def test_one_sided_records_cannot_be_audited(tmp_path: Path) -> None:
    seed = next(s for s in range(1000) if not any(run_assignment(s, i)[1] for i in range(3)))
    runner = AuditRunner(
        gaussian_train, identity_score, num_runs=3, seed=seed, workers=0, progress=False
    )
    with pytest.raises(ValueError, match="0 with and 3 without; train more runs"):
        runner.audit(delta=DELTA)


# Planted strong canaries, so that a positive bound is reachable with few runs: a gradient
# canary in full-batch training (q = 1, in every step) at small noise, and a mislabelled digit
# in a data set of 20 at a large learning rate (the model memorises it).
_STRONG_CANARIES = {
    "gradient": {"steps": 4, "num_examples": 150, "batch_size": 150, "noise_multiplier": 0.3},
    "input": {
        "steps": 40, "num_examples": 20, "batch_size": 16, "noise_multiplier": 0.6,
        "learning_rate": 4.0,
    },
}  # fmt: skip


@pytest.mark.parametrize("canary", ["gradient", "input"])
def test_opacus_digits_end_to_end(tmp_path: Path, single_thread_torch: None, canary: str) -> None:
    from opacus_lastiterate.analysis.audit import plan_multi_run_audit
    from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
    from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer

    num_runs = 32  # perfect separation of 16 + 16 runs certifies about 0.6 (the plan)
    seed = next(
        s for s in range(100) if sum(run_assignment(s, i)[1] for i in range(num_runs)) == 16
    )
    plan = plan_multi_run_audit(num_runs, delta=DELTA).epsilon
    assert plan > 0.5
    options = _STRONG_CANARIES[canary]
    trainer = OpacusDigitsTrainer(canary=canary, **options)  # type: ignore[arg-type]
    path = tmp_path / "runs.jsonl"
    runner = AuditRunner(
        trainer, trainer.score, num_runs=num_runs, seed=seed, path=path, workers=0, progress=False
    )
    result = runner.audit(delta=DELTA)
    assert isinstance(result, AuditResult) and result.is_bound
    records = read_records(path)
    assert len(records) == num_runs and len(records.in_scores) == num_runs // 2
    # the planted canary separates the worlds in every run, so the bound is the plan's
    assert records.in_scores.min() > records.out_scores.max()
    assert result.epsilon == pytest.approx(plan, rel=1e-9)
    # the standard epsilon with a coarser PLD grid: pessimistic, so still an upper bound
    standard = standard_epsilon(
        DELTA, steps=trainer.steps, sample_rate=trainer.sample_rate,
        noise_multiplier=trainer.noise_multiplier, value_discretization_interval=1e-2,
    )  # fmt: skip
    assert 0.0 < result.epsilon < standard
    assert 0.0 < trainer.heuristic_epsilon(DELTA) <= standard
    assert records.config["train"]["fields"]["canary"] == repr(canary)
    rec = records.records[0]  # a run repeats exactly from its seed
    assert trainer.score(trainer(rec.include_canary, rec.seed)) == rec.score


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"canary": "label"}, ValueError, "`canary` must be 'gradient' or 'input'"),
        ({"steps": 0}, ValueError, "`steps` must be an integer >= 1, got 0"),
        ({"num_examples": 5000}, ValueError, r"`num_examples` must be in \[1, 1796\]"),
        ({"noise_multiplier": 0.0}, ValueError, "`noise_multiplier` must be in"),
        ({"canary_coordinate": 640}, ValueError, r"`canary_coordinate` must be in \[0, 639\]"),
        ({"canary": "input", "num_examples": 128, "batch_size": 64}, ValueError, "not divisible"),
    ],
)
def test_opacus_trainer_arguments_are_validated(kwargs: dict, error: type, match: str) -> None:
    from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer

    with pytest.raises(error, match=match):
        OpacusDigitsTrainer(**kwargs)


@pytest.mark.slow
def test_opacus_digits_with_a_process_pool(tmp_path: Path) -> None:
    from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer

    trainer = OpacusDigitsTrainer(steps=20, noise_multiplier=0.5)
    path = tmp_path / "runs.jsonl"
    result = run_audit(
        trainer, trainer.score, num_runs=24, delta=DELTA, path=path, workers=2, progress=False
    )
    serial = AuditRunner(trainer, trainer.score, num_runs=24, workers=0, progress=False).run()
    assert _records(path) == list(serial.records)
    assert result == audit_records(path, delta=DELTA)
    assert result.epsilon <= trainer.heuristic_epsilon(DELTA)


def test_audit_records_is_one_call_on_the_records_score_audit() -> None:
    from opacus_lastiterate.analysis.audit import HeldOutSplit

    records = AuditRunner(gaussian_train, identity_score, num_runs=60, workers=0, progress=False).run()
    audit = records.score_audit()
    assert np.array_equal(audit.in_scores, np.sort(records.in_scores))
    assert audit.num_in + audit.num_out == 60
    strategy = HeldOutSplit(seed=1)
    kw = {"delta": 1e-5, "confidence": 0.9, "threshold_strategy": strategy}
    assert audit_records(records, **kw) == audit.clopper_pearson(**kw)  # type: ignore[arg-type]
    assert audit_records(records, method="gaussian-dp", **kw) == audit.gaussian_dp(**kw)  # type: ignore[arg-type]
    only_in = dataclasses.replace(records, records=tuple(r for r in records.records if r.include_canary))
    with pytest.raises(ValueError, match="with and without the canary"):
        only_in.score_audit()
