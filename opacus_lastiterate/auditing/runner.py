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
Ray (``backend="ray"``, extra ``opacus-lastiterate[ray]``): one Ray task per run, with the
resources of ``cpus_per_run`` / ``gpus_per_run``, retried up to ``max_retries`` times when its
worker process or node dies (``docs/auditing.md``, "Running on a Ray cluster"). Whatever the
backend, only the driver (the process that calls :meth:`AuditRunner.run`) writes records, one
per finished run, so a retried run is recorded once. A progress bar is shown when tqdm is
installed.

Spawned pool workers import the main script; a script that starts an audit at import time
(no ``if __name__ == "__main__":`` guard) is refused in the worker with an error that says so,
and the driver names the cause when its workers die that way.

Run records (``path``, format in :mod:`.run_records`) are JSON lines appended with ``fsync``;
a line cut short by a kill is dropped with a :class:`TruncatedRecordWarning`; an interrupted
audit resumes by skipping the recorded runs; a file written with another configuration is
refused. A finished file can be re-audited with another threshold strategy,
confidence or delta by :func:`audit_records`, without training anything.
"""

from __future__ import annotations

import inspect
import json
import math
import multiprocessing
import multiprocessing.context
import os
import pickle
import signal
import sys
import time
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
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
    _check_json,
    _config_hash,
    _RecordFile,
    callable_identity,
    canonical_json,
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
    instance of a top-level class) for the process pool and Ray. ``isinstance`` checks only
    that an object is callable; :class:`AuditRunner` also checks that it accepts the two
    positional arguments.
    """

    def __call__(self, include_canary: bool, seed: int) -> Any: ...


@runtime_checkable
class ScoreFunction(Protocol):
    """Scores a final model: a finite real number, higher meaning "the canary was in".

    :class:`AuditRunner` checks that it accepts one positional argument.
    """

    def __call__(self, model: Any) -> float: ...


def _check_signature(name: str, fn: object, params: Sequence[str]) -> None:
    """Raise TypeError unless ``fn`` is callable as ``fn(*params)`` (positional arguments).

    Callables whose signature Python cannot inspect (some builtins, C extensions) pass.
    """
    call = f"{name}({', '.join(params)})"
    if not callable(fn):
        raise TypeError(f"`{name}` must be callable as {call}, got {fn!r}.")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*params)
    except TypeError as exc:
        raise TypeError(
            f"`{name}` must be callable as {call} with {len(params)} positional "
            f"argument{'s' if len(params) > 1 else ''}, got {fn!r} with signature {sig} "
            f"({exc})."
        ) from None


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
    """Limit this worker's intra-op threads (process-pool initializer, start of a Ray run)."""
    if threads is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _execute_ray_run(
    train: TrainFunction,
    score: ScoreFunction,
    index: int,
    seed: int,
    include_canary: bool,
    threads: int,
) -> tuple[int, float]:
    """One run as a Ray task: set the worker's threads, then train and score."""
    _init_worker(threads)
    return _execute_run(train, score, index, seed, include_canary)


Task = tuple[int, int, bool]  # (index, seed, include_canary)


def _serial(
    train: TrainFunction, score: ScoreFunction, tasks: Sequence[Task]
) -> Generator[tuple[int, float], None, None]:
    for index, seed, include in tasks:
        yield _execute_run(train, score, index, seed, include)


# Exit status of a spawned worker that found the audit started while it imported the main
# script (see _refuse_audit_in_bootstrapping_worker); the driver turns it into its message.
_MAIN_REIMPORTED_EXIT = 86
_GUARD_HINT = (
    "Worker processes are spawned and each one imports the main script, so the code that "
    'starts the audit must sit under `if __name__ == "__main__":` (see '
    'docs/auditing.md, "Auditing your own training").'
)


def _refuse_audit_in_bootstrapping_worker() -> None:
    """Stop a spawned worker that is running the audit while it imports the main script.

    A ``spawn`` (or ``forkserver``) child imports the parent's main module before it can run
    anything; a script without the ``__main__`` guard therefore starts the audit again in
    every worker. Continuing would train in the worker or fail on the record file's lock, so
    the worker prints what happened and exits with a status the driver recognises.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    module = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    main = getattr(module, "__file__", None) or "the main script"
    print(
        f"opacus_lastiterate: AuditRunner.run() was called while this worker process was "
        f"importing {main} (before it could run anything): the script starts an audit when "
        f"it is imported. {_GUARD_HINT}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(_MAIN_REIMPORTED_EXIT)


class _TrackedSpawnContext(multiprocessing.context.SpawnContext):
    """The ``spawn`` context, remembering the processes it creates (to read exit codes)."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[multiprocessing.context.SpawnProcess] = []

    def Process(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> multiprocessing.context.SpawnProcess:
        proc = multiprocessing.context.SpawnProcess(*args, **kwargs)
        self.processes.append(proc)
        return proc


def _settled_exit_codes(ctx: _TrackedSpawnContext, timeout: float = 10.0) -> list[int | None]:
    """The workers' exit codes once every worker has exited (the executor terminates the
    others once one has died), or at ``timeout``. Polled: the executor's own thread may be
    reaping a worker at the same moment, and then this thread reads no code until that
    thread has stored it."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in ctx.processes:
            proc.join(timeout=0.1)
        codes = [p.exitcode for p in ctx.processes]
        if all(c is not None for c in codes) or time.monotonic() > deadline:
            return codes


def _broken_pool_message(ctx: _TrackedSpawnContext, task: Task) -> str:
    """What stopped the pool: the exit codes of its dead workers, in words."""
    codes = _settled_exit_codes(ctx)
    index, seed, _ = task
    if _MAIN_REIMPORTED_EXIT in codes:
        main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
        return (
            f"the worker processes stopped while importing {main}: that script starts the "
            f"audit when it is imported, so every worker started it again. {_GUARD_HINT}"
        )
    # the executor terminates the other workers (SIGTERM) once one has died
    died = [c for c in codes if c not in (None, 0, -signal.SIGTERM)] or [
        c for c in codes if c not in (None, 0)
    ]
    if not died:
        cause = "a worker process died"
    elif died[0] < 0:
        sig = signal.Signals(-died[0]).name
        cause = f"a worker process was killed by {sig}" + (
            " (killed from outside, or by the out-of-memory killer)" if sig == "SIGKILL" else ""
        )
    else:
        cause = (
            f"a worker process exited with status {died[0]} outside a run (while starting, or "
            "by os._exit or a crash in native code; its output above says more)"
        )
    return (
        f"{cause}; the pool cannot go on, so run {index} (seed {seed}) and the other unfinished "
        "runs were not recorded. The finished runs are: with a record `path`, running the "
        "audit again resumes."
    )


def _process_pool(
    train: TrainFunction,
    score: ScoreFunction,
    tasks: Sequence[Task],
    workers: int,
    threads: int,
) -> Generator[tuple[int, float], None, None]:
    ctx = _TrackedSpawnContext()
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
                if isinstance(exc, BrokenProcessPool):
                    raise RuntimeError(_broken_pool_message(ctx, futures[fut])) from exc
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


_RAY_DEFAULT_IN_FLIGHT = 1000  # runs submitted at once when `workers` is None


def _ray(
    train: TrainFunction,
    score: ScoreFunction,
    tasks: Sequence[Task],
    in_flight: int | None,
    options: Mapping[str, Any],
    threads: int,
) -> Generator[tuple[int, float], None, None]:
    """One Ray task per run; results in completion order.

    ``options`` (``num_cpus``, ``num_gpus``, ``max_retries``) go to ``.options()``: Ray
    schedules a run where its resources are free and re-executes it, up to ``max_retries``
    times, when its worker process or node dies. Exceptions raised by ``train`` or ``score``
    are not retried (a deterministic run would fail again).
    """
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init()  # honours RAY_ADDRESS; call ray.init(...) yourself to pick a cluster
    remote = ray.remote(_execute_ray_run).options(retry_exceptions=False, **options)
    train_ref, score_ref = ray.put(train), ray.put(score)
    window = min(len(tasks), _RAY_DEFAULT_IN_FLIGHT if in_flight is None else max(1, in_flight))
    queue = list(reversed(tasks))
    pending: dict[Any, Task] = {}
    try:
        while queue or pending:
            while queue and len(pending) < window:
                i, s, c = queue.pop()
                pending[remote.remote(train_ref, score_ref, i, s, c, threads)] = (i, s, c)
            done, _ = ray.wait(list(pending), num_returns=1)
            i, s, _c = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:  # raised by train or score
                cause = getattr(exc, "cause", None) or exc
                raise RuntimeError(f"run {i} (seed {s}) failed: {cause!r}") from exc
            except ray.exceptions.RayError as exc:  # the worker, its node or Ray failed
                raise RuntimeError(
                    f"run {i} (seed {s}) failed in Ray ({options['max_retries']} retries "
                    f"allowed, max_retries): {exc}. The finished runs are recorded: with a "
                    "record `path`, running the audit again resumes."
                ) from exc
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
        self.user_config = _check_json("config", config)
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
