"""Run records of many-run audits: one JSON-lines file per audit (``docs/auditing.md``,
"Many-run audits of real training").

A header ``{"type": "header", "format", "config_hash", "config"}`` is written atomically
(temporary file, fsync, link), then one ``{"type": "run", "index", "seed",
"include_canary", "score"}`` line per finished run, appended with a single write and
``fsync`` under an exclusive lock (the package's crash-safe appending writer). A last line without its newline (a kill mid-write) is
dropped with a :class:`TruncatedRecordWarning` and cut off; any other damaged line is an
error. The configuration hash identifies the training and scoring functions (names, dataclass
fields, partial arguments, or a digest of code, closure values and attributes), the master
seed and the user's configuration, so that a file of another configuration is refused.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from opacus_lastiterate._append_file import AppendFile, create_exclusive
from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_int, check_real
from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.auditing.runner.identity import canonical_json, config_diff, config_hash
from opacus_lastiterate.exceptions import TruncatedRecordWarning

__all__ = [
    "RECORD_FORMAT",
    "RunRecord",
    "RunRecords",
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

    def score_audit(self) -> ScoreAudit:
        """The audit of these runs' scores: ``ScoreAudit(in_scores, out_scores)``, whose
        methods give every analysis (``clopper_pearson``, ``gaussian_dp``, ``auroc``, ...).

        Raises:
            ValueError: when the runs lack either side (no run with, or none without, the
                canary).
        """
        ins, outs = self.in_scores, self.out_scores
        if ins.size == 0 or outs.size == 0:
            raise ValueError(
                f"`records` must contain runs with and without the canary, got {ins.size} with "
                f"and {outs.size} without; train more runs."
            )
        return ScoreAudit(ins, outs)

    def first(self, num_runs: int) -> RunRecords:
        """The runs with ``index < num_runs``."""
        n = check_int("num_runs", num_runs, minimum=1)
        return dataclasses.replace(self, records=tuple(r for r in self.records if r.index < n))


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
    if not isinstance(config, dict) or config_hash(config) != digest:
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


def _read(path: Path) -> RunRecords:
    """Parse a record file (a partial last line is ignored and flagged)."""
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
    return RunRecords(records, config, digest, dropped_partial_line=partial)


def read_records(path: str | os.PathLike[str]) -> RunRecords:
    """Read a record file (read-only); a partial last line is ignored with a warning."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"`path` must be an existing audit record file, got {str(p)!r}.")
    records = _read(p)
    if records.dropped_partial_line:
        warn(
            f"{p}: ignored a partial last line (a run interrupted while writing).",
            TruncatedRecordWarning,
        )
    return records


class _RecordFile:
    """The record file of a running audit: locked, each line fsynced (module docs)."""

    def __init__(self, path: Path, config: dict[str, Any], digest: str) -> None:
        self.path = path
        self.existing: tuple[RunRecord, ...] = ()
        if not path.exists():
            header = {
                "type": "header",
                "format": RECORD_FORMAT,
                "config_hash": digest,
                "config": config,
            }
            create_exclusive(path, (canonical_json(header) + "\n").encode())
        self.file = AppendFile(path, fsync_every=1, lock=True, repair=False)
        try:
            records = _read(path)
            if records.config_hash != digest:
                raise ValueError(
                    f"`path` {str(path)!r} was written by an audit with another configuration "
                    f"(hash {records.config_hash[:12]}, this one {digest[:12]}): refusing to "
                    f"resume. Differences: {config_diff(records.config, config)}. "
                    "Use another path or delete the file."
                )
            if records.dropped_partial_line:
                warn(
                    f"{path}: dropped a partial last line (a run interrupted while writing); "
                    "that run will be trained again.",
                    TruncatedRecordWarning,
                )
                self.file.drop_partial_line()
            self.existing = records.records
        except BaseException:
            self.file.close()
            raise

    def append(self, record: RunRecord) -> None:
        self.file.add(record.to_json() + "\n")

    def close(self) -> None:
        self.file.close()  # also releases the lock
