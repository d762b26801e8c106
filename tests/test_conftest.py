"""tests/conftest.py's ``MOVED_TO_SLOW``, run by pytest in a temporary tree that holds a copy
of the conftest and a test file named by one of its patterns."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def _moved_tests() -> tuple[str, list[str]]:
    """A file of a MOVED_TO_SLOW pattern that names one test without a glob, and the tests
    that the patterns name in it."""
    spec = importlib.util.spec_from_file_location("conftest_under_test", CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    single = [p.partition("::")[::2] for p in module.MOVED_TO_SLOW]
    single = [(file, name) for file, name in single if name.isidentifier()]
    assert single, "MOVED_TO_SLOW names no single test"
    file = single[0][0]
    return file, [name for f, name in single if f == file]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, str, list[str]]:
    """(root, file, the tests MOVED_TO_SLOW names in it)."""
    file, moved = _moved_tests()
    (tmp_path / "tests").mkdir()
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    return tmp_path, file, moved


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "not slow", *args],
        cwd=root, capture_output=True, text=True, timeout=120,
    )


def _write(root: Path, file: str, *names: str) -> None:
    path = root / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"def {n}():\n    pass\n\n\n" for n in names))


def test_one_test_selected_by_id_in_a_moved_file_runs(tree: tuple[Path, str, list[str]]) -> None:
    root, file, moved = tree
    _write(root, file, "test_fast", *moved)
    result = _pytest(root, f"{file}::test_fast")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and "MOVED_TO_SLOW" not in result.stderr


def test_whole_file_moves_the_named_test_to_slow(tree: tuple[Path, str, list[str]]) -> None:
    root, file, moved = tree
    _write(root, file, "test_fast", *moved)
    result = _pytest(root, file, "-v")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"1 passed, {len(moved)} deselected" in result.stdout
    assert "::test_fast PASSED" in result.stdout


def test_whole_file_without_the_named_test_is_an_error(tree: tuple[Path, str, list[str]]) -> None:
    """A renamed test would silently move back to make test: reported when the file is
    collected whole."""
    root, file, moved = tree
    _write(root, file, "test_fast", moved[0] + "_renamed", *moved[1:])
    result = _pytest(root, file)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "MOVED_TO_SLOW names no collected test" in result.stderr
    assert f"::{moved[0]}" in result.stderr
