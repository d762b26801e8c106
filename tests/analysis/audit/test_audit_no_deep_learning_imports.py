"""The audit statistics are numpy/scipy only: no module of the subpackage imports torch or opacus."""

from __future__ import annotations

import ast
from pathlib import Path

from opacus_lastiterate.analysis import audit

FORBIDDEN = {"torch", "opacus", "jax", "tensorflow"}


def test_no_forbidden_imports() -> None:
    files = sorted(Path(audit.__file__).parent.glob("*.py"))
    assert len(files) >= 8
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_public_names_exist() -> None:
    for name in audit.__all__:
        assert hasattr(audit, name), name
    assert len(set(audit.__all__)) == len(audit.__all__)
