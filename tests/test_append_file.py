"""The crash-safe appending writer shared by the monitor's file sinks and the audit's records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from opacus_lastiterate._append_file import AppendFile, create_exclusive
from opacus_lastiterate.exceptions import TruncatedRecordWarning

REPO = Path(__file__).resolve().parents[1]


def test_a_torn_last_line_is_cut_off_on_reopen_and_appends_go_on(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"ste')  # a machine crash mid-line
    with pytest.warns(TruncatedRecordWarning, match="dropped a partial last line"):
        f = AppendFile(path, fsync_every=1)
    f.add('{"step": 3}\n')
    f.close()
    assert path.read_bytes() == b'{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_a_file_without_any_newline_is_emptied_and_whole_files_are_left_alone(
    tmp_path: Path,
) -> None:
    torn = tmp_path / "torn"
    torn.write_bytes(b"x" * 70_000)  # longer than one read chunk
    with pytest.warns(TruncatedRecordWarning):
        AppendFile(torn).close()
    assert torn.read_bytes() == b""
    whole = tmp_path / "whole"
    whole.write_bytes(b"a\n" * 40_000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRecordWarning)
        f = AppendFile(whole)
    assert not f.empty
    f.close()
    assert whole.read_bytes() == b"a\n" * 40_000


def test_repair_false_leaves_the_file_until_the_owner_drops_the_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_bytes(b"header\nrun 0\nrun")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRecordWarning)
        f = AppendFile(path, repair=False)
    assert path.read_bytes() == b"header\nrun 0\nrun"  # nothing changed before the check
    assert f.drop_partial_line() is True
    assert f.drop_partial_line() is False
    f.close()
    assert path.read_bytes() == b"header\nrun 0\n"


def test_lines_are_written_whole_in_one_write_per_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "log"
    f = AppendFile(path, flush_every=3)
    writes: list[bytes] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    f.add("one\n")
    f.add("two\n")
    assert path.read_bytes() == b""  # buffered
    f.add("three\n")
    assert writes == [b"one\ntwo\nthree\n"]
    with pytest.raises(ValueError, match="`line` must end with a newline"):
        f.add("four")
    f.close()
    assert path.read_bytes() == b"one\ntwo\nthree\n"


def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    f = AppendFile(tmp_path / "a", fsync_every=2)
    for i in range(5):
        f.add(f"{i}\n")
    assert len(synced) == 2  # after writes 2 and 4
    f.close()
    assert len(synced) == 3  # write 5 at close
    g = AppendFile(tmp_path / "b")
    g.add("x\n")
    g.close()
    assert len(synced) == 3  # None: never


def test_a_killed_writer_leaves_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "log"
    line = "y" * 199 + "\n"
    code = (
        "from opacus_lastiterate._append_file import AppendFile\n"
        f"f = AppendFile({str(path)!r})\n"
        "print('ready', flush=True)\n"
        f"while True: f.add({line!r})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    data = path.read_text()
    assert data and data.endswith("\n")
    assert set(data.splitlines(keepends=True)) == {line}


def test_lock_refuses_a_second_writer(tmp_path: Path) -> None:
    pytest.importorskip("fcntl")
    path = tmp_path / "records"
    first = AppendFile(path, lock=True)
    with pytest.raises(RuntimeError, match="in use by another process"):
        AppendFile(path, lock=True)
    first.close()
    AppendFile(path, lock=True).close()  # released on close


def test_create_exclusive_never_replaces_a_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "records"
    create_exclusive(path, b"header 1\n")
    create_exclusive(path, b"header 2\n")
    assert path.read_bytes() == b"header 1\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["records"]  # no temporary left


@pytest.mark.parametrize(
    "kw,exc",
    [({"flush_every": 0}, ValueError), ({"fsync_every": 1.5}, TypeError), ({"flush_every": True}, TypeError)],
)
def test_bad_arguments_name_the_parameter(tmp_path: Path, kw: dict, exc: type) -> None:
    with pytest.raises(exc, match=f"`{next(iter(kw))}`"):
        AppendFile(tmp_path / "x", **kw)
    assert not (tmp_path / "x").exists()  # validated before the file is created
