"""Many-run auditing of a real training function (``auditing.md``, "Pipeline (multi-run)").

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

Run records (``path``) are JSON lines: a header ``{"type": "header", "config_hash": ...}``
written atomically, then one ``{"type": "run", "index", "seed", "include_canary", "score"}``
line per finished run, appended with a single write and ``fsync``. A line cut short by a kill
(no final newline) is detected, dropped with a :class:`TruncatedRecordWarning` and cut off the
file; an interrupted audit resumes by skipping the recorded runs; a file written with another
configuration is refused. A finished file can be re-audited with another threshold strategy,
confidence or delta by :func:`audit_records`, without training anything.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import multiprocessing
import os
import pickle
import re
import sys
import tempfile
import warnings
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_int, check_real
from opacus_lastiterate.analysis.audit import (
    DEFAULT_THRESHOLD_STRATEGY,
    AuditResult,
    ThresholdStrategy,
    audit_clopper_pearson,
    audit_gaussian_dp,
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

#: Format tag written in every record file's header.
RECORD_FORMAT = "opacus-lastiterate/audit-runs/1"

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


class TruncatedRecordWarning(UserWarning):
    """A record file ended in a partial line (a run killed while writing); it was dropped."""


@dataclass(frozen=True)
class RunRecord:
    """One training run of an audit.

    Attributes:
        index: position of the run in the audit (0-based).
        seed: the seed passed to ``train``.
        include_canary: the coin: True when trained on D' (with the canary).
        score: ``score(model)`` of the final model.
    """

    index: int
    seed: int
    include_canary: bool
    score: float

    def to_json(self) -> str:
        """The record as one JSON line (without the newline); floats round-trip exactly."""
        return json.dumps(
            {
                "type": "run",
                "index": self.index,
                "seed": self.seed,
                "include_canary": self.include_canary,
                "score": self.score,
            },
            allow_nan=False,
        )


@dataclass(frozen=True)
class RunRecords:
    """Runs of an audit, sorted by index, with the configuration they were produced under.

    Attributes:
        records: the runs, sorted by ``index``.
        config: the configuration stored in the header (JSON data).
        config_hash: SHA-256 of ``config`` (canonical JSON).
        dropped_partial_line: True when the file ended in a partial line that was dropped.
    """

    records: tuple[RunRecord, ...]
    config: Mapping[str, Any]
    config_hash: str
    dropped_partial_line: bool = False

    def __len__(self) -> int:
        return len(self.records)

    @property
    def in_scores(self) -> np.ndarray:
        """Scores of the runs trained with the canary (D')."""
        return np.array([r.score for r in self.records if r.include_canary], dtype=np.float64)

    @property
    def out_scores(self) -> np.ndarray:
        """Scores of the runs trained without the canary (D)."""
        return np.array([r.score for r in self.records if not r.include_canary], dtype=np.float64)

    def first(self, num_runs: int) -> RunRecords:
        """The runs with ``index < num_runs``."""
        n = check_int("num_runs", num_runs, minimum=1)
        return dataclasses.replace(self, records=tuple(r for r in self.records if r.index < n))


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


def _qualified_name(obj: Any) -> str:
    return (
        f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
    )


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _state_digest(fn: Any) -> str | None:
    """SHA-256 of what a name does not show: a function's code, defaults and closure values,
    or a plain instance's attributes (reprs with memory addresses removed, so that the same
    configuration hashes alike in a later session)."""
    parts: list[str] = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        parts += [code.co_code.hex(), repr(code.co_consts), repr(getattr(fn, "__defaults__", None))]
        parts += [repr(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())]
    elif hasattr(fn, "__dict__") and not inspect.isclass(fn):
        parts.append(repr(sorted(vars(fn).items())))
    if not parts:
        return None
    return hashlib.sha256(_ADDRESS.sub("", "\0".join(parts)).encode()).hexdigest()


def _callable_identity(fn: Any) -> Any:
    """JSON-able description of a callable: its qualified name, plus the fields of a
    dataclass instance, the bound instance of a method, a partial's arguments, or a digest of
    a function's code and closure / a plain instance's attributes (so that ``make(0.0)`` and
    ``make(50.0)`` closures, or ``Trainer(0)`` and ``Trainer(50)``, are told apart)."""
    if isinstance(fn, functools.partial):
        return {
            "partial": _callable_identity(fn.func),
            "args": [repr(a) for a in fn.args],
            "keywords": {k: repr(v) for k, v in sorted(fn.keywords.items())},
        }
    if inspect.ismethod(fn):
        return {"method": _qualified_name(fn.__func__), "self": _callable_identity(fn.__self__)}
    if inspect.isbuiltin(fn) or inspect.isclass(fn):
        return _qualified_name(fn)
    if inspect.isfunction(fn):
        return {"function": _qualified_name(fn), "state": _state_digest(fn)}
    ident: dict[str, Any] = {"instance": _qualified_name(type(fn))}
    if dataclasses.is_dataclass(fn):
        ident["fields"] = {f.name: repr(getattr(fn, f.name)) for f in dataclasses.fields(fn)}
    else:
        ident["state"] = _state_digest(fn)
    return ident


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _config_hash(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(_canonical(config).encode()).hexdigest()


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


def _config_diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """The configuration entries that differ, one ``key: stored -> current`` each."""
    a, b = _flatten(dict(stored)), _flatten(dict(current))
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return "; ".join(
        f"{k}: {_canonical(a.get(k, '<absent>'))} -> {_canonical(b.get(k, '<absent>'))}"
        for k in keys
    )


def _check_json(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"`{name}` must be a mapping of JSON data or None, got {type(value).__name__}."
        )
    try:
        out = json.loads(_canonical(dict(value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"`{name}` must contain JSON data only (finite numbers), got {value!r}."
        ) from exc
    return dict(out)


# --------------------------------------------------------------------------- record file


def _parse_header(line: bytes, path: Path) -> tuple[dict[str, Any], str]:
    try:
        header = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"`path` {str(path)!r} is not an audit record file: bad header.") from exc
    if not isinstance(header, dict) or header.get("type") != "header":
        raise ValueError(f"`path` {str(path)!r} is not an audit record file: no header line.")
    if header.get("format") != RECORD_FORMAT:
        raise ValueError(
            f"`path` {str(path)!r} has record format {header.get('format')!r}; "
            f"this version reads {RECORD_FORMAT!r}."
        )
    config, digest = header.get("config"), header.get("config_hash")
    if not isinstance(config, dict) or _config_hash(config) != digest:
        raise ValueError(f"`path` {str(path)!r}: the header's config does not match its hash.")
    return config, str(digest)


def _parse_record(line: bytes, path: Path, lineno: int) -> RunRecord:
    try:
        d = json.loads(line)
        if d.get("type") != "run":
            raise ValueError("not a run record")
        rec = RunRecord(
            index=check_int("index", d["index"]),
            seed=check_int("seed", d["seed"]),
            include_canary=d["include_canary"],
            score=check_real("score", d["score"]),
        )
        if not isinstance(rec.include_canary, bool) or not math.isfinite(rec.score):
            raise ValueError("bad coin or score")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(
            f"`path` {str(path)!r}: line {lineno} is a corrupted run record ({exc}); "
            "only a partial last line can come from an interrupted run."
        ) from exc
    return rec


def _read(path: Path) -> tuple[RunRecords, int]:
    """Parse a record file; return the records and the byte length of its complete lines."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1  # complete lines end with a newline; the rest is partial
    partial = end < len(data)
    lines = data[:end].split(b"\n")[:-1]
    if not lines:
        raise ValueError(f"`path` {str(path)!r} is not an audit record file: it has no header.")
    config, digest = _parse_header(lines[0], path)
    seen: dict[int, RunRecord] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        rec = _parse_record(line, path, lineno)
        old = seen.setdefault(rec.index, rec)
        if old != rec:
            raise ValueError(
                f"`path` {str(path)!r}: run {rec.index} is recorded twice with different values."
            )
    records = tuple(seen[i] for i in sorted(seen))
    return RunRecords(records, config, digest, dropped_partial_line=partial), end


def read_records(path: str | os.PathLike[str]) -> RunRecords:
    """Read a record file (read-only); a partial last line is ignored with a warning."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"`path` must be an existing audit record file, got {str(p)!r}.")
    records, _ = _read(p)
    if records.dropped_partial_line:
        warnings.warn(
            f"{p}: ignored a partial last line (a run interrupted while writing).",
            TruncatedRecordWarning,
            stacklevel=2,
        )
    return records


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _RecordFile:
    """Append-only, fsynced, locked record file."""

    def __init__(self, path: Path, config: dict[str, Any], digest: str) -> None:
        self.path = path
        self.existing: tuple[RunRecord, ...] = ()
        if not path.exists():
            self._create(config, digest)
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND)
        try:
            self._lock()
            records, end = _read(path)
            if records.config_hash != digest:
                raise ValueError(
                    f"`path` {str(path)!r} was written by an audit with another configuration "
                    f"(hash {records.config_hash[:12]}, this one {digest[:12]}): refusing to "
                    f"resume. Differences: {_config_diff(records.config, config)}. "
                    "Use another path or delete the file."
                )
            if records.dropped_partial_line:
                warnings.warn(
                    f"{path}: dropped a partial last line (a run interrupted while writing); "
                    "that run will be trained again.",
                    TruncatedRecordWarning,
                    stacklevel=4,
                )
                os.ftruncate(self.fd, end)
                os.fsync(self.fd)
            self.existing = records.records
        except BaseException:
            os.close(self.fd)
            raise

    def _create(self, config: dict[str, Any], digest: str) -> None:
        header = {
            "type": "header",
            "format": RECORD_FORMAT,
            "config_hash": digest,
            "config": config,
        }
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=directory)
        try:
            _write_all(fd, (_canonical(header) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            # link (not replace): never clobbers a file another runner created meanwhile
            os.link(tmp, self.path)
        except FileExistsError:
            pass
        except OSError:  # pragma: no cover - filesystems without hard links
            if not self.path.exists():
                os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        _fsync_dir(directory)

    def _lock(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory lock
            return
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise RuntimeError(
                f"`path` {str(self.path)!r} is in use by another running audit."
            ) from exc

    def append(self, record: RunRecord) -> None:
        _write_all(self.fd, (record.to_json() + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)  # also releases the lock


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
    audit = audit_clopper_pearson if method == "clopper-pearson" else audit_gaussian_dp
    return audit(
        ins, outs, delta=delta, confidence=confidence, threshold_strategy=threshold_strategy
    )


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
