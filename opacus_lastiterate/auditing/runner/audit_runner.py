"""Many-run auditing of a real training function (``docs/auditing.md``, "Pipeline (multi-run)").

The user supplies two picklable, top-level callables:

* ``train(include_canary: bool, seed: int) -> model``: trains one model on D (``False``) or
  on D' = D + canary (``True``) with all its randomness drawn from ``seed``, and returns the
  final model only;
* ``score(model) -> float``: one real number, higher meaning "the canary was in".

:class:`AuditRunner` trains R models, each on D or D' by a fair coin, scores them and turns
the scores into an :class:`~opacus_lastiterate.analysis.audit.AuditResult` (a Clopper-Pearson
lower bound with a valid threshold strategy by default). Run ``i``'s coin and training seed
come from ``numpy.random.SeedSequence(seed, spawn_key=(i,))``: they depend on the master seed
and ``i`` only, so an audit is reproducible run by run and can be extended to more runs.

Backends: an in-process loop (``workers=0``), a local spawn-safe process pool (default,
:mod:`~opacus_lastiterate.auditing.runner.process_pool`), or Ray (:mod:`~opacus_lastiterate.auditing.runner.ray_backend`, ``backend="ray"``, extra
``opacus-lastiterate[ray]``): one Ray task per run, with the resources of ``cpus_per_run`` / ``gpus_per_run``, retried up to ``max_retries`` times when its
worker process or node dies (``docs/auditing.md``, "Running on a Ray cluster"). Whatever the
backend, only the driver (the process that calls :meth:`AuditRunner.run`) writes records, one
per finished run, so a retried run is recorded once. A progress bar is shown when tqdm is
installed.

Spawned pool workers import the main script; a script that starts an audit at import time
(no ``if __name__ == "__main__":`` guard) is refused in the worker with an error that says so,
and the driver names the cause when its workers die that way.

Run records (``path``, format in :mod:`~opacus_lastiterate.auditing.runner.records`) are JSON lines appended with ``fsync``;
a line cut short by a kill is dropped with a :class:`TruncatedRecordWarning`; an interrupted
audit resumes by skipping the recorded runs; a file written with another configuration is
refused. A finished file can be re-audited with another threshold strategy,
confidence or delta by :func:`audit_records`, without training anything.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit import AuditResult, ThresholdStrategy
from opacus_lastiterate.analysis.audit.threshold_strategies import DEFAULT_THRESHOLD_STRATEGY
from opacus_lastiterate.auditing.runner.contract import (
    ScoreFunction,
    Task,
    TrainFunction,
    _check_signature,
    _checked_score,
    _serial,
    run_assignment,
)
from opacus_lastiterate.auditing.runner.identity import (
    callable_identity,
    canonical_json,
    check_json,
    config_hash,
)
from opacus_lastiterate.auditing.runner.process_pool import (
    _check_picklable,
    _process_pool,
    _refuse_audit_in_bootstrapping_worker,
)
from opacus_lastiterate.auditing.runner.ray_backend import _import_ray, _ray
from opacus_lastiterate.auditing.runner.records import (
    RECORD_FORMAT,
    RunRecord,
    RunRecords,
    _RecordFile,
    read_records,
)

__all__ = ["AuditRunner", "audit_records", "run_audit"]

Backend = Literal["process", "ray"]
Method = Literal["clopper-pearson", "gaussian-dp"]


def _progress_bar(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional (extra "progress"): no bar
        return None
    return tqdm(total=total, initial=initial, desc="audit runs", unit="run")


class AuditRunner:
    """Trains R models on D or D' by seeded fair coins, records them, and audits the scores.

    Args:
        train: ``train(include_canary, seed) -> model`` (:class:`TrainFunction`).
        score: ``score(model) -> float`` (:class:`ScoreFunction`), higher = "in".
        num_runs: R >= 2, the number of models.
        seed: master seed of the coins and training seeds (integer >= 0).
        path: JSON-lines record file (resumed if it exists); None keeps records in memory.
        workers: worker processes (None: ``os.cpu_count()``; 0: run in this process). With
            Ray, the most runs submitted at once (None: 1000); Ray starts each one when the
            cluster has its resources free.
        backend: ``"process"`` (local spawn-safe process pool, default) or ``"ray"`` (the
            cluster of ``ray.init``, started locally if none; ``docs/auditing.md``, "Running
            on a Ray cluster").
        progress: show a tqdm progress bar if tqdm is installed.
        config: further JSON data that identifies the experiment (hyper-parameters that the
            ``train`` identity does not show); part of the configuration hash.
        threads_per_worker: intra-op (torch, OpenMP) threads of each worker. None: 1 in the
            process pool; with Ray, the run's ``cpus_per_run`` rounded down (at least 1).
        cpus_per_run: Ray only: CPUs one run requests (a real >= 0; None: 1).
        gpus_per_run: Ray only: GPUs one run requests (a real >= 0, fractions share a GPU;
            None: 0). Ray makes them visible to the run through ``CUDA_VISIBLE_DEVICES``, so
            ``train`` uses ``"cuda"``.
        max_retries: Ray only: how often a run whose worker process or node died is started
            again (integer >= 0; None: 3). Exceptions raised by ``train`` or ``score`` are not
            retried.

    Only this process writes records, one when a run's result arrives, so a retried or
    resumed run is recorded once. With the process pool, the code that runs the audit must
    sit under ``if __name__ == "__main__":`` in a script (workers import the main script).

    The configuration hash covers the master seed, the identities of ``train`` and ``score``
    (qualified names; a dataclass instance's fields; a partial's arguments) and ``config``;
    ``num_runs`` is not part of it, so a finished audit can be extended to more runs. Fix
    the number of runs before looking at any result: extending an audit because its bound
    looked too small (optional stopping) invalidates the stated confidence.
    """

    def __init__(
        self,
        train: TrainFunction,
        score: ScoreFunction,
        *,
        num_runs: int,
        seed: int = 0,
        path: str | os.PathLike[str] | None = None,
        workers: int | None = None,
        backend: Backend = "process",
        progress: bool = True,
        config: Mapping[str, Any] | None = None,
        threads_per_worker: int | None = None,
        cpus_per_run: float | None = None,
        gpus_per_run: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        _check_signature("train", train, ("include_canary", "seed"))
        _check_signature("score", score, ("model",))
        self.train = train
        self.score = score
        self.num_runs = check_int("num_runs", num_runs, minimum=2)
        self.seed = check_int("seed", seed)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"`path` must be a path or None, got {path!r}.")
        self.path = None if path is None else Path(path)
        self.workers = None if workers is None else check_int("workers", workers, minimum=0)
        if backend not in ("process", "ray"):
            raise ValueError(f"`backend` must be 'process' or 'ray', got {backend!r}.")
        self.backend: Backend = backend
        if not isinstance(progress, bool):
            raise TypeError(f"`progress` must be a bool, got {progress!r}.")
        self.progress = progress
        self.user_config = check_json("config", config)
        self.threads_per_worker = (
            None
            if threads_per_worker is None
            else check_int("threads_per_worker", threads_per_worker, minimum=1)
        )
        ray_only = {"cpus_per_run": cpus_per_run, "gpus_per_run": gpus_per_run}
        ray_only["max_retries"] = max_retries
        if backend != "ray":
            for name, value in ray_only.items():
                if value is not None:
                    raise ValueError(
                        f"`{name}` applies to backend='ray' only, got {name}={value!r} with "
                        f"backend={backend!r}; the process pool runs on this machine "
                        "(`workers`, `threads_per_worker`) and does not retry."
                    )
        #: Ray task options of one run: num_cpus, num_gpus, max_retries.
        self.ray_options: dict[str, Any] = {
            "num_cpus": 1.0
            if cpus_per_run is None
            else check_in_interval("cpus_per_run", cpus_per_run, 0.0, math.inf, low_open=False),
            "num_gpus": 0.0
            if gpus_per_run is None
            else check_in_interval("gpus_per_run", gpus_per_run, 0.0, math.inf, low_open=False),
            "max_retries": 3 if max_retries is None else check_int("max_retries", max_retries),
        }
        self.config: dict[str, Any] = json.loads(
            canonical_json(
                {
                    "format": RECORD_FORMAT,
                    "seed": self.seed,
                    "train": callable_identity(train),
                    "score": callable_identity(score),
                    "user": self.user_config,
                }
            )
        )
        self.config_hash = config_hash(self.config)
        self._records: dict[int, RunRecord] = {}
        #: number of runs trained by the last :meth:`run` (the others were resumed).
        self.last_trained = 0

    def assignments(self) -> list[tuple[int, bool]]:
        """``(training seed, include_canary)`` of every run, in order."""
        return [run_assignment(self.seed, i) for i in range(self.num_runs)]

    def _check_resumed(self, records: Sequence[RunRecord]) -> None:
        for rec in records:
            seed, coin = run_assignment(self.seed, rec.index)
            if (rec.seed, rec.include_canary) != (seed, coin):
                raise ValueError(
                    f"`path` {str(self.path)!r}: run {rec.index} has seed {rec.seed} and coin "
                    f"{rec.include_canary}, but this configuration assigns {seed} and {coin}."
                )

    def run(self) -> RunRecords:
        """Train and score the runs not yet recorded; return all R records."""
        _refuse_audit_in_bootstrapping_worker()
        file = None
        if self.path is not None:
            file = _RecordFile(self.path, self.config, self.config_hash)
        try:
            if file is not None:
                self._check_resumed(file.existing)
                for rec in file.existing:
                    self._records.setdefault(rec.index, rec)
            todo: list[Task] = [
                (i, *run_assignment(self.seed, i))
                for i in range(self.num_runs)
                if i not in self._records
            ]
            self.last_trained = 0
            if todo:
                self._train(todo, file)
        finally:
            if file is not None:
                file.close()
        return RunRecords(
            tuple(self._records[i] for i in range(self.num_runs)), self.config, self.config_hash
        )

    def _results(self, todo: Sequence[Task]) -> Generator[tuple[int, float], None, None]:
        if self.backend == "ray":
            threads = self.threads_per_worker or max(1, int(self.ray_options["num_cpus"]))
            return _ray(self.train, self.score, todo, self.workers, self.ray_options, threads)
        workers = (os.cpu_count() or 1) if self.workers is None else self.workers
        if workers == 0:
            return _serial(self.train, self.score, todo)
        _check_picklable("train", self.train)
        _check_picklable("score", self.score)
        return _process_pool(
            self.train, self.score, todo, min(workers, len(todo)), self.threads_per_worker or 1
        )

    def _train(self, todo: Sequence[Task], file: _RecordFile | None) -> None:
        if self.backend == "ray":
            _import_ray()  # fail before anything else
        tasks = {i: (s, c) for i, s, c in todo}
        results = self._results(todo)  # checks picklability before any bar is drawn
        bar = _progress_bar(self.num_runs, self.num_runs - len(todo), self.progress)
        try:
            for index, value in results:
                seed, coin = tasks[index]
                rec = RunRecord(index, seed, coin, _checked_score(value, index))
                if file is not None:
                    file.append(rec)
                self._records[index] = rec
                self.last_trained += 1
                if bar is not None:
                    bar.update(1)
        finally:
            results.close()  # stops the workers if we leave early
            if bar is not None:
                bar.close()

    def audit(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
        method: Method = "clopper-pearson",
    ) -> AuditResult:
        """Run what is missing, then audit all R scores (see :func:`audit_records`)."""
        _check_audit_args(delta, confidence, threshold_strategy, method)
        return audit_records(
            self.run(),
            delta=delta,
            confidence=confidence,
            threshold_strategy=threshold_strategy,
            method=method,
        )


def _check_audit_args(
    delta: object, confidence: object, threshold_strategy: object, method: object
) -> None:
    """Check the audit's arguments before anything is trained."""
    if method not in ("clopper-pearson", "gaussian-dp"):
        raise ValueError(f"`method` must be 'clopper-pearson' or 'gaussian-dp', got {method!r}.")
    low_open = method == "gaussian-dp"  # the GDP conversion needs delta > 0
    check_in_interval("delta", delta, 0.0, 1.0, low_open=low_open)
    check_in_interval("confidence", confidence, 0.0, 1.0)
    if not isinstance(threshold_strategy, ThresholdStrategy):
        raise TypeError(
            f"`threshold_strategy` must be a ThresholdStrategy, got {threshold_strategy!r} of "
            f"type {type(threshold_strategy).__name__}."
        )


def audit_records(
    records: RunRecords | str | os.PathLike[str],
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    method: Method = "clopper-pearson",
    num_runs: int | None = None,
) -> AuditResult:
    """Audit recorded runs (a :class:`RunRecords` or a record file), training nothing.

    One call on :class:`~opacus_lastiterate.analysis.audit.ScoreAudit`:
    ``records.score_audit().clopper_pearson(...)`` (or ``.gaussian_dp(...)``), after reading
    the file and checking the arguments.

    Args:
        records: the runs, or the path of a record file.
        delta: delta of the audit.
        confidence: confidence of the audit, in (0, 1).
        threshold_strategy: how the threshold is chosen (default: valid Bonferroni grid).
        method: ``"clopper-pearson"`` (a lower bound, default) or ``"gaussian-dp"`` (an
            estimate that assumes a Gaussian trade-off curve).
        num_runs: audit only the runs with ``index < num_runs`` (None: all).
    """
    if not isinstance(records, RunRecords):
        if not isinstance(records, (str, os.PathLike)):
            raise TypeError(f"`records` must be RunRecords or a path, got {records!r}.")
        records = read_records(records)
    if num_runs is not None:
        records = records.first(num_runs)
    _check_audit_args(delta, confidence, threshold_strategy, method)
    audit = records.score_audit()
    analysis = audit.clopper_pearson if method == "clopper-pearson" else audit.gaussian_dp
    return analysis(delta=delta, confidence=confidence, threshold_strategy=threshold_strategy)


def run_audit(
    train: TrainFunction,
    score: ScoreFunction,
    *,
    num_runs: int,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    method: Method = "clopper-pearson",
    seed: int = 0,
    path: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    backend: Backend = "process",
    progress: bool = True,
    config: Mapping[str, Any] | None = None,
    threads_per_worker: int | None = None,
    cpus_per_run: float | None = None,
    gpus_per_run: float | None = None,
    max_retries: int | None = None,
) -> AuditResult:
    """Train R models on D or D' (seeded fair coins), score them, return the audit.

    Shorthand for ``AuditRunner(...).audit(...)``; see :class:`AuditRunner` for the
    arguments. The result is a Clopper-Pearson lower bound by default.
    """
    runner = AuditRunner(
        train,
        score,
        num_runs=num_runs,
        seed=seed,
        path=path,
        workers=workers,
        backend=backend,
        progress=progress,
        config=config,
        threads_per_worker=threads_per_worker,
        cpus_per_run=cpus_per_run,
        gpus_per_run=gpus_per_run,
        max_retries=max_retries,
    )
    return runner.audit(
        delta=delta, confidence=confidence, threshold_strategy=threshold_strategy, method=method
    )
