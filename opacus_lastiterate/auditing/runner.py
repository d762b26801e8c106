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

Backends: an in-process loop (``workers=0``), a local spawn-safe process pool (default), or
Ray (``backend="ray"``, extra ``opacus-lastiterate[ray]``). A progress bar is shown when tqdm
is installed.

Run records (``path``, format in :mod:`.run_records`) are JSON lines appended with ``fsync``;
a line cut short by a kill is dropped with a :class:`TruncatedRecordWarning`; an interrupted
audit resumes by skipping the recorded runs; a file written with another configuration is
refused. A finished file can be re-audited with another threshold strategy,
confidence or delta by :func:`audit_records`, without training anything.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import sys
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_int, check_real
from opacus_lastiterate.analysis.audit import (
    DEFAULT_THRESHOLD_STRATEGY,
    AuditResult,
    ScoreAudit,
    ThresholdStrategy,
)
from opacus_lastiterate.auditing.run_records import (
    RECORD_FORMAT,
    RunRecord,
    RunRecords,
    TruncatedRecordWarning,
    _callable_identity,
    _canonical,
    _check_json,
    _config_hash,
    _RecordFile,
    read_records,
)

__all__ = [
    "RECORD_FORMAT",
    "AuditRunner",
    "RunRecord",
    "RunRecords",
    "ScoreFunction",
    "TrainFunction",
    "TruncatedRecordWarning",
    "audit_records",
    "read_records",
    "run_assignment",
    "run_audit",
]

Backend = Literal["process", "ray"]
Method = Literal["clopper-pearson", "gaussian-dp"]
_SEED_BOUND = 2**31  # training seeds lie in [0, 2**31): valid for numpy, torch and random


@runtime_checkable
class TrainFunction(Protocol):
    """Trains one model on D (``include_canary=False``) or D' and returns the final model.

    All randomness (initialisation excepted, if it is fixed on purpose) must come from
    ``seed``, so that a run can be repeated. Must be picklable (a top-level function or an
    instance of a top-level class) for the process pool and Ray.
    """

    def __call__(self, include_canary: bool, seed: int) -> Any: ...


@runtime_checkable
class ScoreFunction(Protocol):
    """Scores a final model: a finite real number, higher meaning "the canary was in"."""

    def __call__(self, model: Any) -> float: ...


# --------------------------------------------------------------------------- configuration


def run_assignment(seed: int, index: int) -> tuple[int, bool]:
    """``(training seed, include_canary)`` of run ``index`` of an audit with master ``seed``.

    Drawn from ``numpy.random.default_rng(SeedSequence(seed, spawn_key=(index,)))``: the coin
    is a fair ``integers(0, 2)``, the training seed is uniform in [0, 2**31).
    """
    s = check_int("seed", seed)
    i = check_int("index", index)
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(i,)))
    include = bool(rng.integers(0, 2))
    train_seed = int(rng.integers(0, _SEED_BOUND))
    return train_seed, include


# --------------------------------------------------------------------------- execution


def _checked_score(value: Any, index: int) -> float:
    name = f"score of run {index}"
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # numpy / torch scalars
    x = check_real(name, value)
    if not math.isfinite(x):
        raise ValueError(f"`{name}` must be finite, got {x!r}.")
    return x


def _execute_run(
    train: TrainFunction, score: ScoreFunction, index: int, seed: int, include_canary: bool
) -> tuple[int, float]:
    """Train and score one run (runs in a worker)."""
    model = train(include_canary, seed)
    return index, _checked_score(score(model), index)


def _init_worker(threads: int | None) -> None:
    """Process-pool initializer: limit each worker's intra-op threads."""
    if threads is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


Task = tuple[int, int, bool]  # (index, seed, include_canary)


def _serial(
    train: TrainFunction, score: ScoreFunction, tasks: Sequence[Task]
) -> Generator[tuple[int, float], None, None]:
    for index, seed, include in tasks:
        yield _execute_run(train, score, index, seed, include)


def _process_pool(
    train: TrainFunction,
    score: ScoreFunction,
    tasks: Sequence[Task],
    workers: int,
    threads: int | None,
) -> Generator[tuple[int, float], None, None]:
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)
    )
    try:
        futures: dict[Future[tuple[int, float]], Task] = {
            pool.submit(_execute_run, train, score, i, s, c): (i, s, c) for i, s, c in tasks
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futures[f][0]):
                exc = fut.exception()
                if exc is not None:
                    i, s, _ = futures[fut]
                    raise RuntimeError(f"run {i} (seed {s}) failed: {exc!r}") from exc
                yield fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "backend='ray' needs Ray, which is not installed: pip install opacus-lastiterate[ray]"
        ) from exc
    return ray


def _ray(
    train: TrainFunction, score: ScoreFunction, tasks: Sequence[Task], workers: int | None
) -> Generator[tuple[int, float], None, None]:
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init()  # honours RAY_ADDRESS; call ray.init(...) yourself to pick a cluster
    remote = ray.remote(_execute_run)
    train_ref, score_ref = ray.put(train), ray.put(score)
    window = len(tasks) if workers is None else max(1, workers)
    queue = list(tasks)
    pending: dict[Any, Task] = {}
    try:
        while queue or pending:
            while queue and len(pending) < window:
                i, s, c = queue.pop(0)
                pending[remote.remote(train_ref, score_ref, i, s, c)] = (i, s, c)
            done, _ = ray.wait(list(pending), num_returns=1)
            task = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except Exception as exc:
                raise RuntimeError(f"run {task[0]} (seed {task[1]}) failed: {exc!r}") from exc
            yield result
    finally:
        for ref in pending:
            ray.cancel(ref)


def _progress_bar(total: int, initial: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional (extra "progress"): no bar
        return None
    return tqdm(total=total, initial=initial, desc="audit runs", unit="run")


def _check_picklable(name: str, obj: Any) -> None:
    try:
        pickle.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"`{name}` must be picklable (a top-level function or an instance of a top-level "
            f"class) to run in worker processes, got {obj!r} ({exc}). Use workers=0 to run "
            "in this process."
        ) from exc


# --------------------------------------------------------------------------- the runner


class AuditRunner:
    """Trains R models on D or D' by seeded fair coins, records them, and audits the scores.

    Args:
        train: ``train(include_canary, seed) -> model`` (:class:`TrainFunction`).
        score: ``score(model) -> float`` (:class:`ScoreFunction`), higher = "in".
        num_runs: R >= 2, the number of models.
        seed: master seed of the coins and training seeds (integer >= 0).
        path: JSON-lines record file (resumed if it exists); None keeps records in memory.
        workers: worker processes (None: ``os.cpu_count()``; 0: run in this process). With
            Ray, the most runs in flight (None: all).
        backend: ``"process"`` (local spawn-safe process pool) or ``"ray"``.
        progress: show a tqdm progress bar if tqdm is installed.
        config: further JSON data that identifies the experiment (hyper-parameters that the
            ``train`` identity does not show); part of the configuration hash.
        threads_per_worker: intra-op threads of each pool worker (None: leave as is).

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
        threads_per_worker: int | None = 1,
    ) -> None:
        if not callable(train):
            raise TypeError(f"`train` must be callable, got {train!r}.")
        if not callable(score):
            raise TypeError(f"`score` must be callable, got {score!r}.")
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
        self.user_config = _check_json("config", config)
        self.threads_per_worker = (
            None
            if threads_per_worker is None
            else check_int("threads_per_worker", threads_per_worker, minimum=1)
        )
        self.config: dict[str, Any] = json.loads(
            _canonical(
                {
                    "format": RECORD_FORMAT,
                    "seed": self.seed,
                    "train": _callable_identity(train),
                    "score": _callable_identity(score),
                    "user": self.user_config,
                }
            )
        )
        self.config_hash = _config_hash(self.config)
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
            return _ray(self.train, self.score, todo, self.workers)
        workers = (os.cpu_count() or 1) if self.workers is None else self.workers
        if workers == 0:
            return _serial(self.train, self.score, todo)
        _check_picklable("train", self.train)
        _check_picklable("score", self.score)
        return _process_pool(
            self.train, self.score, todo, min(workers, len(todo)), self.threads_per_worker
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
    ins, outs = records.in_scores, records.out_scores
    if ins.size == 0 or outs.size == 0:
        raise ValueError(
            f"`records` must contain runs with and without the canary, got {ins.size} with and "
            f"{outs.size} without; train more runs."
        )
    audit = ScoreAudit(ins, outs)
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
    )
    return runner.audit(
        delta=delta, confidence=confidence, threshold_strategy=threshold_strategy, method=method
    )
