"""Commands and paths as they may be committed: no absolute path of one machine.

Scripts that record the command that produced a result file (``"command"`` fields of
``docs/results/*.json``) pass it through :func:`portable_command`: a path inside the
repository becomes relative to its root, any other absolute path (a temporary folder, a
folder of virtual environments, an interpreter of a Python version manager) becomes a
placeholder named after its option, ``<envs>``, ``<python>``. :func:`portable_text` does the
same for free text (error messages that quote a file of an environment).
``tests/test_no_machine_paths.py`` greps the tracked files for such paths.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def portable_path(value: str | os.PathLike[str], placeholder: str, root: Path = ROOT) -> str:
    """``value`` relative to ``root`` when inside it, ``<placeholder>`` when absolute elsewhere."""
    text = os.fspath(value)
    if not os.path.isabs(text):
        return text
    path = Path(text).resolve()
    try:
        return path.relative_to(root.resolve()).as_posix() or "."
    except ValueError:
        return f"<{placeholder}>"


def portable_command(script: str, argv: Sequence[str], root: Path = ROOT) -> str:
    """``python SCRIPT ARGV...`` with every absolute path made portable (see module doc)."""
    words: list[str] = []
    option = "path"
    for arg in argv:
        if arg.startswith("--") and "=" in arg:
            name, _, value = arg.partition("=")
            words.append(f"{name}={portable_path(value, name.lstrip('-'), root)}")
            continue
        if arg.startswith("-") and not os.path.isabs(arg):
            option = arg.lstrip("-") or "path"
            words.append(arg)
            continue
        words.append(portable_path(arg, option, root))
    return " ".join(["python", script, *(w if w.startswith("<") else shlex.quote(w)
                                         for w in words)])


def portable_text(text: str, prefixes: Mapping[str | os.PathLike[str], str],
                  root: Path = ROOT) -> str:
    """``text`` with each absolute prefix replaced by ``<name>`` (longest first), then the
    repository root by ``.``."""
    pairs = [(os.fspath(p), name) for p, name in prefixes.items() if os.path.isabs(os.fspath(p))]
    for prefix, name in sorted(pairs, key=lambda pair: -len(pair[0])):
        text = text.replace(prefix.rstrip("/"), f"<{name}>")
    return text.replace(str(root.resolve()) + "/", "")
