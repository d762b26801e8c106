"""No tracked file names an absolute path of one machine (issue 26).

A home folder (``/root/``, ``/home/NAME/``, ``/Users/NAME/``), this workplace's ``/work/``,
a named temporary folder (``/tmp/NAME``), a Python version manager's folder (``.pyenv``,
``.conda/envs``) or an absolute ``site-packages`` path in a committed file is a path that
exists on one machine only. Result files record their command through
``scripts/portable_paths.py``, which writes such paths as ``<option>`` placeholders.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
START = r"(?<![\w.~$}>-])"  # an absolute path begins here (not inside a relative one)
MACHINE_PATH = re.compile(
    START + r"/(?:root|home/[\w.-]+|Users/[\w.-]+|work|tmp/[\w.-]+)/?"
    r"|[\\/]\.pyenv[\\/]|[\\/]\.conda[\\/]envs[\\/]"
    r"|" + START + r"/[\w./-]*/site-packages/"
    r"|\b[A-Z]:\\Users\\"
)
THIS = Path(__file__).relative_to(ROOT).as_posix()


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if name == THIS or not path.is_file():
            continue
        if b"\0" in path.read_bytes()[:8192]:  # binary (pictures)
            continue
        files.append(path)
    return files


@pytest.mark.parametrize("text", [
    "/root/.cache/x", "--envs /work/venvs-opacus", "/home/alice/repo", "--work /tmp/wc2048",
    "/root/.pyenv/versions/3.11.7/bin/python", "(/opt/env/lib/python3.11/site-packages/torch)",
    "C:\\Users\\bob\\x", '"work": "/tmp/digits-input-audit-runs"', "~/.pyenv/versions/3.8",
])
def test_the_pattern_finds_machine_paths(text: str) -> None:
    assert MACHINE_PATH.search(text), text


@pytest.mark.parametrize("text", [
    "docs/results/work/x", "runs/wc2048", "$HOME/.cache/opacus-lastiterate", "network/work/",
    "https://github.com/opacus-lastiterate/opacus-lastiterate/tree/main/docs", "/tmp",
    "--envs <envs> --python <python>", "${TMPDIR}/x", "home/alice",
])
def test_the_pattern_leaves_portable_paths(text: str) -> None:
    assert not MACHINE_PATH.search(text), text


def test_no_tracked_file_names_a_machine_path() -> None:
    found = []
    for path in tracked_text_files():
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            match = MACHINE_PATH.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in "
                             f"{line.strip()[:120]!r}")
    assert not found, "absolute paths of one machine in tracked files:\n" + "\n".join(found)


def _portable_paths():
    spec = importlib.util.spec_from_file_location("portable_paths",
                                                  ROOT / "scripts" / "portable_paths.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("portable_paths", module)
    spec.loader.exec_module(module)
    return module


def test_recorded_commands_name_no_machine_path(tmp_path: Path) -> None:
    """The function the result-writing scripts use: inside the repository relative, outside
    a placeholder named after the option; the result passes the grep above."""
    pp = _portable_paths()
    root = tmp_path / "repo"
    (root / "docs" / "results").mkdir(parents=True)
    argv = ["--envs", "/work/venvs-opacus", "--python", "/root/.pyenv/versions/3.11.7/bin/python",
            "--native", f"--out={root}/docs/results", "--work", "/tmp/wc2048/runs",
            "--epsilons", "4,10", "--extra-canaries", "", "--quick"]
    command = pp.portable_command("scripts/x.py", argv, root=root)
    assert command == ("python scripts/x.py --envs <envs> --python <python> --native "
                       "--out=docs/results --work <work> --epsilons 4,10 --extra-canaries '' "
                       "--quick")
    assert not MACHINE_PATH.search(command)
    text = pp.portable_text(
        "ImportError (/work/venvs-opacus/base/lib/python3.11/site-packages/torch/m.py)",
        {"/work/venvs-opacus": "envs"}, root=root)
    assert text == "ImportError (<envs>/base/lib/python3.11/site-packages/torch/m.py)"
    assert not MACHINE_PATH.search(text)
