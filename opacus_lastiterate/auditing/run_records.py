"""Run records of many-run audits: one JSON-lines file per audit (``docs/auditing.md``,
"Many-run audits of real training").

A header ``{"type": "header", "format", "config_hash", "config"}`` is written atomically
(temporary file, fsync, rename), then one ``{"type": "run", "index", "seed",
"include_canary", "score"}`` line per finished run, appended with a single write and
``fsync`` under an exclusive lock. A last line without its newline (a kill mid-write) is
dropped with a :class:`TruncatedRecordWarning` and cut off; any other damaged line is an
error. The configuration hash identifies the training and scoring functions (names, dataclass
fields, partial arguments, or a digest of code, closure values and attributes), the master
seed and the user's configuration, so that a file of another configuration is refused.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_int, check_real
from opacus_lastiterate.exceptions import TruncatedRecordWarning  # defined there, re-exported

__all__ = [
    "RECORD_FORMAT",
    "RunRecord",
    "RunRecords",
    "TruncatedRecordWarning",
    "read_records",
]

#: Format tag written in every record file's header.
RECORD_FORMAT = "opacus-lastiterate/audit-runs/1"


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


def callable_identity(fn: Any) -> Any:
    """JSON-able description of a callable: its qualified name, plus the fields of a
    dataclass instance, the bound instance of a method, a partial's arguments, or a digest of
    a function's code and closure / a plain instance's attributes (so that ``make(0.0)`` and
    ``make(50.0)`` closures, or ``Trainer(0)`` and ``Trainer(50)``, are told apart)."""
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_identity(fn.func),
            "args": [repr(a) for a in fn.args],
            "keywords": {k: repr(v) for k, v in sorted(fn.keywords.items())},
        }
    if inspect.ismethod(fn):
        return {"method": _qualified_name(fn.__func__), "self": callable_identity(fn.__self__)}
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


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _config_hash(config: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


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
        f"{k}: {canonical_json(a.get(k, '<absent>'))} -> {canonical_json(b.get(k, '<absent>'))}"
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
        out = json.loads(canonical_json(dict(value)))
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
        warn(
            f"{p}: ignored a partial last line (a run interrupted while writing).",
            TruncatedRecordWarning,
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
                warn(
                    f"{path}: dropped a partial last line (a run interrupted while writing); "
                    "that run will be trained again.",
                    TruncatedRecordWarning,
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
            _write_all(fd, (canonical_json(header) + "\n").encode())
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
