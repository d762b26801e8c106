"""The runner's Ray backend on a local Ray cluster: records, resources, a killed worker, a
killed driver. One cluster (2 CPUs, 1 declared GPU) is shared by the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

# Keep the test cluster on the loopback interface (Ray otherwise binds to the address the
# machine reaches the outside with); Ray reads this when it is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray")

from opacus_lastiterate.auditing.runner import AuditRunner, read_records  # noqa: E402
from opacus_lastiterate.auditing.runner.contract import run_assignment  # noqa: E402
from opacus_lastiterate.exceptions import TruncatedRecordWarning  # noqa: E402

# slow: a Ray cluster and its workers start in tens of seconds on a small machine.
# xdist_group would keep the module on one xdist worker (one cluster) under
# `--dist loadgroup`, but pytest-xdist 3.8 with pytest 9.2 ignores the group (pytest-xdist
# issue 1386), so `make test-slow` (-n 2) may start one cluster per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def gaussian_train(include_canary: bool, seed: int) -> float:
    """A 'model' that is N(0, 1) from the seed, shifted by 2 with the canary."""
    return float(np.random.default_rng(seed).normal()) + (2.0 if include_canary else 0.0)


def slow_gaussian_train(include_canary: bool, seed: int) -> float:
    """:func:`gaussian_train`, slow enough for its driver to be killed mid-audit."""
    time.sleep(0.1)
    return gaussian_train(include_canary, seed)


def identity_score(model: float) -> float:
    return model


@dataclass(frozen=True)
class KillOnce:
    """:func:`gaussian_train`, except that the run with ``victim_seed`` SIGKILLs its own
    worker process the first time (it leaves ``marker`` behind, so a retry runs normally)."""

    marker: str
    victim_seed: int

    def __call__(self, include_canary: bool, seed: int) -> float:
        if seed == self.victim_seed and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # pragma: no cover - never reached
        return gaussian_train(include_canary, seed)


@dataclass(frozen=True)
class Probe:
    """Returns, as the 'model', what the run's worker was given."""

    what: str

    def __call__(self, include_canary: bool, seed: int) -> float:
        resources = ray.get_runtime_context().get_assigned_resources()
        if self.what == "cpus":
            return float(resources.get("CPU", 0.0))
        if self.what == "gpus":  # the GPU share, if the GPU is made visible to the run
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return float(resources.get("GPU", 0.0)) if visible == "0" else -1.0
        return float(os.environ["OMP_NUM_THREADS"])  # "threads"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _serial(train, num_runs: int, seed: int):
    return AuditRunner(
        train, identity_score, num_runs=num_runs, seed=seed, workers=0, progress=False
    ).run()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray cluster for the module; yields its address for other drivers."""
    ray.init(
        num_cpus=2,
        num_gpus=1,  # declared only: lets the tests check GPU requests without a GPU
        include_dashboard=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_ray_gives_the_records_of_a_serial_run(cluster: str, tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    runner = AuditRunner(
        gaussian_train, identity_score, num_runs=24, seed=3, path=path, backend="ray",
        workers=5, progress=False,
    )  # fmt: skip
    records = runner.run()
    assert records.records == _serial(gaussian_train, 24, 3).records
    assert list(read_records(path).records) == list(records.records)
    assert len(_lines(path)) == 1 + 24 and runner.last_trained == 24


def test_per_run_resource_requests_reach_the_run(cluster: str) -> None:
    cases = [
        ({"cpus_per_run": 2}, "cpus", 2.0),
        ({"cpus_per_run": 0.5}, "cpus", 0.5),
        ({}, "cpus", 1.0),
        ({"cpus_per_run": 2}, "threads", 2.0),  # intra-op threads follow the CPUs
        ({"cpus_per_run": 2, "threads_per_worker": 1}, "threads", 1.0),
        ({"gpus_per_run": 0.5}, "gpus", 0.5),
    ]
    for options, what, expected in cases:
        runner = AuditRunner(
            Probe(what), identity_score, num_runs=2, backend="ray", progress=False, **options
        )
        assert [r.score for r in runner.run().records] == [expected, expected], options


def test_a_killed_worker_is_retried_and_its_run_recorded_once(cluster: str, tmp_path: Path) -> None:
    num_runs, seed, victim = 12, 1, 5
    marker = tmp_path / "killed.pid"
    train = KillOnce(str(marker), run_assignment(seed, victim)[0])
    path = tmp_path / "runs.jsonl"
    runner = AuditRunner(
        train, identity_score, num_runs=num_runs, seed=seed, path=path, backend="ray",
        progress=False,
    )  # fmt: skip
    records = runner.run()
    assert marker.exists()  # the worker of run `victim` was killed
    assert records.records == _serial(gaussian_train, num_runs, seed).records
    indices = [json.loads(line)["index"] for line in _lines(path)[1:]]
    assert sorted(indices) == list(range(num_runs))  # none lost, none twice


def test_without_retries_a_killed_worker_fails_the_run_and_a_rerun_completes(
    cluster: str, tmp_path: Path
) -> None:
    num_runs, seed, victim = 8, 2, 0
    marker = tmp_path / "killed.pid"
    train = KillOnce(str(marker), run_assignment(seed, victim)[0])
    path = tmp_path / "runs.jsonl"
    kwargs = {"num_runs": num_runs, "seed": seed, "path": path, "backend": "ray"}
    failing = AuditRunner(
        train,
        identity_score,
        max_retries=0,
        workers=1,
        progress=False,
        **kwargs,  # type: ignore[arg-type]
    )
    with pytest.raises(RuntimeError, match=f"run {victim} .*failed in Ray \\(0 retries allowed"):
        failing.run()
    assert marker.exists() and len(read_records(path)) == 0  # run 0 came first, alone
    again = AuditRunner(train, identity_score, progress=False, **kwargs)  # type: ignore[arg-type]
    assert again.run().records == _serial(gaussian_train, num_runs, seed).records
    assert again.last_trained == num_runs and len(_lines(path)) == 1 + num_runs


def test_an_exception_in_train_is_not_retried(cluster: str) -> None:
    runner = AuditRunner(
        _raise_value_error, identity_score, num_runs=2, backend="ray", progress=False
    )
    with pytest.raises(RuntimeError, match=r"run \d \(seed \d+\) failed: .*bad run"):
        runner.run()


def _raise_value_error(include_canary: bool, seed: int) -> float:
    raise ValueError("bad run")


def test_resume_after_the_driver_is_killed(cluster: str, tmp_path: Path) -> None:
    num_runs, seed = 30, 7
    path = tmp_path / "runs.jsonl"
    child = (
        "import importlib, json, sys\n"
        f"sys.path[:0] = json.loads({json.dumps(json.dumps(sys.path))})\n"
        "import ray\n"
        f"ray.init(address={cluster!r})\n"
        f"mod = importlib.import_module({slow_gaussian_train.__module__!r})\n"
        "from opacus_lastiterate.auditing.runner import AuditRunner\n"
        f"AuditRunner(mod.slow_gaussian_train, mod.identity_score, num_runs={num_runs}, "
        f"seed={seed}, path={str(path)!r}, backend='ray', workers=1, progress=False).run()\n"
    )
    log = tmp_path / "driver.log"
    proc = subprocess.Popen(
        # from the repository root: Ray puts the driver's working directory on its workers'
        # path, and they import this test module by name to unpickle the training function
        [sys.executable, "-c", child], cwd=Path(__file__).resolve().parents[3],
        stderr=log.open("w"), stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not (path.exists() and len(_lines(path)) >= 1 + 4):
            assert proc.poll() is None, (
                "the driver finished or crashed before it was killed: " + log.read_text()[-3000:]
            )
            assert time.monotonic() < deadline, "the driver wrote no records"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:  # pragma: no cover
            proc.kill()
            proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedRecordWarning)  # a kill mid-write is allowed
        done = len(read_records(path))
    assert 4 <= done < num_runs

    resumed = AuditRunner(
        slow_gaussian_train, identity_score, num_runs=num_runs, seed=seed, path=path,
        backend="ray", progress=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncatedRecordWarning)
        records = resumed.run()
    assert resumed.last_trained == num_runs - done
    assert records.records == _serial(gaussian_train, num_runs, seed).records
    assert len(_lines(path)) == 1 + num_runs  # no run recorded twice
