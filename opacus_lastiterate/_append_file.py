"""Crash-safe appending of whole lines: the one writer of the monitor's JSON-lines and CSV
sinks and of the many-run audit's record files.

* **Whole lines**: lines are buffered (``flush_every``) and each flush is one ``os.write``
  on a file opened with ``O_APPEND``, so a killed process leaves only whole lines (the
  kernel completes a write it has started); buffered lines are lost, never truncated.
* **fsync policy**: ``fsync_every=k`` calls ``os.fsync`` every k writes, after cutting off a
  torn line and on close; None leaves write-back to the OS.
* **A torn last line** (a machine crash) is cut off when the file is opened again, with a
  :class:`~opacus_lastiterate.exceptions.TruncatedRecordWarning`; an owner that checks the
  file first opens it with ``repair=False`` and calls :meth:`AppendFile.drop_partial_line`.
* **One writer**: ``lock=True`` holds an advisory ``flock`` while open (where ``fcntl``
  exists) and refuses a file another process holds.
* **Atomic rewrites**: :meth:`AppendFile.rewind` writes a temporary file and renames it over
  the file; :func:`create_exclusive` creates a file with its first content in one step,
  never replacing one that exists.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from opacus_lastiterate._warn import warn
from opacus_lastiterate.exceptions import TruncatedRecordWarning

__all__ = ["AppendFile", "create_exclusive"]

_CHUNK = 1 << 16


def _check_every(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an integer >= 1, got {value!r}.")
    if value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return value


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd`` (a regular file takes it in one call; loop for completeness)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: Path) -> None:
    """fsync a directory, so that a file created or renamed in it survives a crash."""
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


def create_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data`` in one step (a fsynced temporary file linked to the
    name, the directory fsynced), unless it exists: a file another process created meanwhile
    is kept, never replaced."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=directory)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # link (not replace): never clobbers an existing file
    except FileExistsError:
        pass
    except OSError:  # pragma: no cover - filesystems without hard links
        if not path.exists():
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _fsync_directory(directory)


def _complete_length(fd: int) -> int:
    """The byte length of the file's complete lines (up to and including its last newline)."""
    end = os.fstat(fd).st_size
    while end > 0:
        start = max(0, end - _CHUNK)
        os.lseek(fd, start, os.SEEK_SET)
        chunk = os.read(fd, end - start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        end = start
    return 0


class AppendFile:
    """Whole-line appends to ``path`` (module docs): created with its parent directories,
    appended to if it exists.

    Args:
        path: the file.
        flush_every: write every k lines (1: each line is in the file when ``add`` returns).
        fsync_every: also ``fsync`` every k writes (None: never; the OS writes back).
        lock: hold an exclusive advisory lock while open.
        repair: cut off a torn last line now, with a warning (False: the owner calls
            :meth:`drop_partial_line` after checking the file).

    Raises:
        TypeError, ValueError: on a bad ``flush_every`` or ``fsync_every``.
        RuntimeError: with ``lock``, if another process holds the file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        flush_every: int = 1,
        fsync_every: int | None = None,
        lock: bool = False,
        repair: bool = True,
    ) -> None:
        self.flush_every = _check_every("flush_every", flush_every)
        self.fsync_every = None if fsync_every is None else _check_every("fsync_every", fsync_every)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock
        self._buffer: list[str] = []
        self._writes = 0
        self._unsynced = False
        self._last_bytes = 0  # length of the last line written to the file
        self._fd: int | None = self._open()
        try:
            if repair and self.drop_partial_line():
                warn(
                    f"{self.path}: dropped a partial last line (a write cut short by a crash).",
                    TruncatedRecordWarning,
                )
        except BaseException:
            self.close()
            raise

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if self._lock:
            try:
                import fcntl
            except ImportError:  # pragma: no cover - Windows: no advisory lock
                return fd
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                raise RuntimeError(
                    f"`path` {str(self.path)!r} is in use by another process."
                ) from exc
        return fd

    def _file(self) -> int:
        if self._fd is None:
            raise ValueError(f"the file {self.path} is closed.")
        return self._fd

    @property
    def empty(self) -> bool:
        """Whether the file holds nothing (buffered lines not counted)."""
        return os.fstat(self._file()).st_size == 0

    def drop_partial_line(self) -> bool:
        """Cut off a last line without its newline (fsynced under the policy); True if
        there was one."""
        fd = self._file()
        end = _complete_length(fd)
        if end == os.fstat(fd).st_size:
            return False
        os.ftruncate(fd, end)
        if self.fsync_every is not None:
            os.fsync(fd)
        return True

    def add(self, line: str) -> None:
        """Append ``line`` (ending with a newline); written at the next flush."""
        if not line.endswith("\n"):
            raise ValueError(f"`line` must end with a newline, got {line[-40:]!r}.")
        self._buffer.append(line)
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines with one ``os.write``."""
        fd = self._file()
        if not self._buffer:
            return
        self._last_bytes = len(self._buffer[-1].encode())
        data = "".join(self._buffer).encode()
        self._buffer = []
        _write_all(fd, data)
        self._writes += 1
        self._unsynced = True
        if self.fsync_every is not None and self._writes % self.fsync_every == 0:
            os.fsync(fd)
            self._unsynced = False

    def replace_last(self, line: str) -> None:
        """Replace the last line added (buffered or written) by ``line``."""
        if self._buffer:
            self._buffer[-1] = line
            return
        fd = self._file()
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - self._last_bytes))
        self.add(line)
        self.flush()

    def rewind(self, keep: Callable[[str], bool]) -> None:
        """Rewrite the file with the lines that ``keep`` accepts (buffered lines included),
        atomically (a temporary file, fsynced under the policy, renamed over it), and go on
        appending to it."""
        self.flush()
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if keep(line)]
        if len(kept) == len(lines):
            return
        tmp = self.path.with_name(self.path.name + ".rewind")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, "".join(kept).encode())
            if self.fsync_every is not None:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.close(self._file())
        self._fd = None
        os.replace(tmp, self.path)
        if self.fsync_every is not None:
            _fsync_directory(self.path.parent)
        self._fd = self._open()
        self._last_bytes = 0

    def close(self) -> None:
        """Write the buffered lines (fsynced under the policy) and close; closing twice is
        harmless."""
        if self._fd is None:
            return
        try:
            self.flush()
            if self.fsync_every is not None and self._unsynced:
                os.fsync(self._fd)
        finally:
            os.close(self._fd)  # also releases the lock
            self._fd = None
