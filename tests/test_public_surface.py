"""The root's public names: few, each listed once, each the object of its subpackage, and
typed by the stub ``opacus_lastiterate/__init__.pyi`` with exactly the same names."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import opacus_lastiterate

ROOT = Path(opacus_lastiterate.__file__).parent
MAX_ROOT_NAMES = 30


def _stub_names() -> set[str]:
    tree = ast.parse((ROOT / "__init__.pyi").read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert alias.asname == alias.name, f"{alias.name}: re-export as itself"
                names.add(alias.name)
    return names - {"accountants", "analysis", "exceptions"}


def test_the_root_exposes_at_most_30_names_each_once() -> None:
    names = opacus_lastiterate.__all__
    assert len(names) == len(set(names)), "a root name is listed twice"
    assert 15 <= len(names) <= MAX_ROOT_NAMES, names


def test_the_stub_types_exactly_the_root_names() -> None:
    assert _stub_names() == set(opacus_lastiterate.__all__)


def test_each_root_name_is_its_subpackages_object() -> None:
    tree = ast.parse((ROOT / "__init__.pyi").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "opacus_lastiterate":
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert getattr(opacus_lastiterate, alias.name) is getattr(module, alias.name)


def test_importing_the_root_loads_neither_torch_nor_the_mathematics() -> None:
    code = (
        "import sys, opacus_lastiterate as p; "
        "print(sorted(m for m in ('torch', 'opacus', 'scipy', 'opacus_lastiterate.analysis') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
