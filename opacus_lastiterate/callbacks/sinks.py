"""Where a :class:`~opacus_lastiterate.callbacks.monitor.PrivacyMonitor` sends its records.

A sink is any callable taking an :class:`~opacus_lastiterate.callbacks.monitor.EpsilonRecord`
(``close()`` is called by ``monitor.finish()`` when present). This module has:

* :class:`LoggingSink`: Python :mod:`logging`, one line per record (formatted only if the
  level is enabled);
* :class:`JsonlSink`, :class:`CsvSink`: append-only files (``rewind(step)``, called when the
  monitor loads a checkpoint, drops the records after that step). **Durability:** each record (or
  each batch of ``flush_every`` records) is written with one ``os.write`` on a file opened
  with ``O_APPEND``, never through a Python buffer, so a killed process leaves only whole
  lines (the kernel completes a write system call it has started); ``fsync_every=k`` also
  calls ``os.fsync`` every k writes, for a machine crash. Records still buffered when the
  process dies (``flush_every > 1``) are lost, never truncated; a last line torn by a machine
  crash is cut off when the file is opened again, with a ``TruncatedRecordWarning``. JSON
  lines use ``null`` for a value not computed at that step and ``Infinity`` for an infinite
  epsilon (Python's :mod:`json` reads both); CSV leaves such cells empty (``inf`` for
  infinity);
* :class:`TensorBoardSink`: a ``torch.utils.tensorboard.SummaryWriter`` (optional import);
* :class:`WandbSink`, :class:`MlflowSink`: Weights & Biases and MLflow, imported only when
  such a sink is created.

**One row per step.** The monitor's final record (``final: true``) usually has the step of
the last per-step record. The file sinks then *replace* that step's row by the final one
(the last line is rewritten: the file never holds a step twice); TensorBoard, W&B and MLflow
get only the values that the step's row did not have yet (robust, PLD, corrected), at the
same step. A final record of a step with no row yet is an ordinary row with ``final`` true.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import numbers
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opacus_lastiterate._append_file import AppendFile
from opacus_lastiterate._warn import warn
from opacus_lastiterate.callbacks.records import FIELDS, LABELS, EpsilonRecord
from opacus_lastiterate.exceptions import MonitorWarning

__all__ = [
    "CsvSink",
    "JsonlSink",
    "LoggingSink",
    "MlflowSink",
    "TensorBoardSink",
    "WandbSink",
]

_SCALARS = (*LABELS, "lr", "noise_multiplier", "sample_rate")


def _check_every(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"`{name}` must be an integer >= 1, got {value!r}."
        )
    return value


def _scalars(record: EpsilonRecord) -> dict[str, float]:
    return {k: v for k in _SCALARS if (v := getattr(record, k)) is not None}


class _StepScalars:
    """The scalars of a record, less those already sent at the same step (module docs,
    "One row per step"): what a metrics sink sends for it."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._sent: dict[str, float] = {}

    def new(self, record: EpsilonRecord) -> dict[str, float]:
        scalars = _scalars(record)
        if record.step != self._step:
            self._step, self._sent = record.step, dict(scalars)
            return scalars
        fresh = {k: v for k, v in scalars.items() if self._sent.get(k) != v}
        self._sent.update(fresh)
        return fresh


class LoggingSink:
    """One log line per record (every ``every``-th record, and always the final one).

    Args:
        logger: a :class:`logging.Logger` or its name (default ``"opacus_lastiterate.privacy"``).
        level: the logging level (default INFO).
        every: log every k-th record.
    """

    def __init__(
        self, logger: logging.Logger | str | None = None, *, level: int = logging.INFO, every: int = 1
    ) -> None:
        if logger is None or isinstance(logger, str):
            logger = logging.getLogger(logger or "opacus_lastiterate.privacy")
        if not isinstance(logger, logging.Logger):
            raise TypeError(f"`logger` must be a logging.Logger or a name, got {logger!r}.")
        self.logger, self.level = logger, level
        self.every = _check_every("every", every)
        self._labelled = False

    def __call__(self, record: EpsilonRecord) -> None:
        if not (record.final or record.step % self.every == 0):
            return
        if not self.logger.isEnabledFor(self.level):
            return
        if not self._labelled:
            self._labelled = True
            for key, label in record.labels().items():
                self.logger.log(self.level, "privacy column %s = %s", key, label)
        parts = [f"step {record.step}"] + [
            f"{k}={v:.4f}" for k, v in record.epsilons().items()
        ]
        if record.lr is not None:
            parts.append(f"lr={record.lr:.4g}")
        parts.append(f"delta={record.delta:g}")
        self.logger.log(self.level, "privacy%s: %s", " (final)" if record.final else "", ", ".join(parts))


class _FileSink:
    """A sink writing through an :class:`~opacus_lastiterate._append_file.AppendFile`
    (``self._file``): one row per step (a final record of the last row's step replaces that
    row, module docs)."""

    _file: AppendFile
    _last_step: int | None = None

    def _add_row(self, record: EpsilonRecord, line: str) -> None:
        if record.final and record.step == self._last_step:
            self._file.replace_last(line)
        else:
            self._file.add(line)
        self._last_step = record.step

    def flush(self) -> None:
        """Write buffered records now."""
        self._file.flush()

    def close(self) -> None:
        """Write buffered records and close the file."""
        self._file.close()


class JsonlSink(_FileSink):
    """One JSON object per line, appended to ``path`` (module docs, "Durability").

    Args:
        path: the file; created with its parent directories, appended to if it exists.
        flush_every: write every k records (1: each record is on disk when the step ends).
        fsync_every: also ``fsync`` every k writes (None: never; the OS writes back).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, flush_every: int = 1, fsync_every: int | None = None
    ) -> None:
        self._file = AppendFile(path, flush_every=flush_every, fsync_every=fsync_every)
        self.path = self._file.path

    def __call__(self, record: EpsilonRecord) -> None:
        self._add_row(record, json.dumps(record.as_dict()) + "\n")

    def rewind(self, step: int) -> None:
        """Drop the records of steps after ``step`` (the monitor calls this when it loads a
        checkpoint of that step, so that a resumed run neither repeats nor skips a step).
        Lines that are not records are kept."""

        def keep(line: str) -> bool:
            try:
                return int(json.loads(line)["step"]) <= step
            except (ValueError, KeyError, TypeError):
                return True

        self._file.rewind(keep)
        self._last_step = None  # the next record starts a row


class CsvSink(_FileSink):
    """One CSV row per record (header :data:`~.monitor.FIELDS` on a new file), appended.

    Arguments as :class:`JsonlSink`. Appending to a file with another header is refused.

    Raises:
        ValueError: if ``path`` is not empty and its first line is not the header.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, flush_every: int = 1, fsync_every: int | None = None
    ) -> None:
        self.path = Path(path)
        header = self._row(FIELDS)
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open(newline="") as f:
                first = f.readline()
            if first != header:
                raise ValueError(
                    f"`path` {str(self.path)!r} has another header ({first.strip()!r}); "
                    "a CsvSink appends only to its own files."
                )
        self._file = AppendFile(path, flush_every=flush_every, fsync_every=fsync_every)
        if self._file.empty:
            self._file.add(header)
            self._file.flush()

    @staticmethod
    def _row(values: Sequence[Any]) -> str:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(values)
        return buffer.getvalue()

    @staticmethod
    def _cell(value: Any) -> Any:
        if value is None:
            return ""
        if isinstance(value, float) and math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value

    def __call__(self, record: EpsilonRecord) -> None:
        self._add_row(record, self._row([self._cell(getattr(record, f)) for f in FIELDS]))

    def rewind(self, step: int) -> None:
        """Drop the rows of steps after ``step`` (as :meth:`JsonlSink.rewind`); the header
        and lines that are not rows are kept."""

        def keep(line: str) -> bool:
            try:
                return int(next(csv.reader([line]))[0]) <= step
            except (ValueError, IndexError, StopIteration):
                return True

        self._file.rewind(keep)
        self._last_step = None  # the next record starts a row


class TensorBoardSink:
    """Scalars ``<prefix>/<field>`` at global step ``record.step`` in a TensorBoard log.

    Args:
        writer: a ``torch.utils.tensorboard.SummaryWriter`` (or anything with
            ``add_scalar(tag, value, step)``), or a log directory to create one in (needs
            the ``tensorboard`` package).
        prefix: the tag prefix.
    """

    def __init__(self, writer: Any, *, prefix: str = "privacy") -> None:
        if isinstance(writer, (str, os.PathLike)):
            from torch.utils.tensorboard import SummaryWriter  # needs `tensorboard`

            writer = SummaryWriter(log_dir=os.fspath(writer))
            self._owned = True
        else:
            self._owned = False
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                f"`writer` must be a SummaryWriter or a log directory, got {type(writer).__name__}."
            )
        self.writer, self.prefix = writer, prefix
        self._rows = _StepScalars()

    def __call__(self, record: EpsilonRecord) -> None:
        for key, value in self._rows.new(record).items():
            self.writer.add_scalar(f"{self.prefix}/{key}", value, record.step)

    def close(self) -> None:
        """Flush the writer (and close it if this sink created it)."""
        self.writer.flush()
        if self._owned:
            self.writer.close()


class WandbSink:
    """``wandb.log`` of the scalars under ``<prefix>/``, with ``<prefix>/step``.

    Args:
        run: a ``wandb`` run (default: the active run, ``wandb.run``).
        prefix: the key prefix.

    Raises:
        ImportError: if ``wandb`` is not installed.
        ValueError: if no run is given and none is active (call ``wandb.init`` first).
    """

    def __init__(self, run: Any = None, *, prefix: str = "privacy") -> None:
        if run is None:
            import wandb

            run = wandb.run
            if run is None:
                raise ValueError("`run` is None and no wandb run is active: call wandb.init().")
        self.run, self.prefix = run, prefix
        self._rows = _StepScalars()

    def __call__(self, record: EpsilonRecord) -> None:
        data = {f"{self.prefix}/{k}": v for k, v in self._rows.new(record).items()}
        data[f"{self.prefix}/step"] = record.step
        self.run.log(data, commit=False)


class MlflowSink:
    """``mlflow.log_metrics`` of the scalars (keys ``<prefix>_<field>``) at ``step``.

    Args:
        client: the ``mlflow`` module (default) or anything with ``log_metrics(dict, step=)``.
        prefix: the key prefix.

    Raises:
        ImportError: if ``client`` is None and ``mlflow`` is not installed.
    """

    def __init__(self, client: Any = None, *, prefix: str = "privacy") -> None:
        if client is None:
            import mlflow

            client = mlflow
        self.client, self.prefix = client, prefix
        self._rows = _StepScalars()

    def __call__(self, record: EpsilonRecord) -> None:
        metrics = {
            f"{self.prefix}_{k}": v
            for k, v in self._rows.new(record).items()
            if math.isfinite(v)
        }
        self.client.log_metrics(metrics, step=record.step)


# -- which process calls the sinks -----------------------------------------------------------


def process_rank() -> int:
    """This process's ``torch.distributed`` rank; 0 without an initialised process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def check_sink_rank(value: object) -> int | None:
    """The rank whose process calls the sinks: an integer >= 0, or None (every rank)."""
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ValueError(f"`sink_rank` must be an integer >= 0 or None, got {value!r}.")
    return int(value)


# -- sending records: each sink fails alone --------------------------------------------------


def sink_name(sink: object) -> str:
    """How a warning names a sink: its class (with its ``path`` if it has one) or, for a
    function or bound method, its qualified name."""
    path = getattr(sink, "path", None)
    if path is not None:
        return f"{type(sink).__name__}({str(path)!r})"
    name = getattr(sink, "__qualname__", None)
    return name if isinstance(name, str) else type(sink).__name__


class SinkDispatch:
    """Calls the monitor's sinks, each on its own: a sink that raises (a full disk, a lost
    connection) is reported once, by a :class:`~opacus_lastiterate.exceptions.MonitorWarning`
    naming it and its error, and set aside for the rest of the run; the other sinks get
    every record, and the exception never reaches the training loop.

    Args:
        sinks: the monitor's list of sinks (read at each call: sinks added later are sent
            records too).
    """

    def __init__(self, sinks: Sequence[Callable[[EpsilonRecord], Any]]) -> None:
        self.sinks = sinks
        self.set_aside: list[object] = []
        """The sinks that failed, in order (no longer called)."""

    def _active(self) -> list[Any]:
        return [s for s in self.sinks if not any(s is f for f in self.set_aside)]

    def _fail(self, sink: object, what: str, err: Exception) -> None:
        self.set_aside.append(sink)
        warn(
            f"PrivacyMonitor: the sink {sink_name(sink)} failed {what} "
            f"({type(err).__name__}: {err}); it is set aside and gets no more records in this "
            "run. The other sinks and the accountant keep every record; training goes on.",
            MonitorWarning,
        )

    def send(self, record: EpsilonRecord) -> None:
        """Call every sink that has not failed with ``record``."""
        for sink in self._active():
            try:
                sink(record)
            except Exception as err:  # a log never stops training
                self._fail(sink, f"on the record of step {record.step}", err)

    def call(self, method: str, *args: Any, failed_too: bool = False) -> None:
        """Call ``sink.method(*args)`` on the sinks that have it (``rewind``, ``close``);
        ``failed_too``: also on those set aside (to release what they hold), quietly."""
        for sink in list(self.sinks) if failed_too else self._active():
            function = getattr(sink, method, None)
            if not callable(function):
                continue
            try:
                function(*args)
            except Exception as err:
                if not any(sink is f for f in self.set_aside):
                    self._fail(sink, f"in {method}()", err)
