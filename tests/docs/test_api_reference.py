"""Every public name appears in the API reference (docs/api/, docs/_ext/public_api.py).

Without a build: every public module (no path component starting with ``_``) has exactly one
``api-module`` directive on a page of docs/api/, and every name of every public ``__all__``
resolves to one home module that is rendered there and really defines the object (so that
autodoc can describe it). With a build (``slow``): ``sphinx-build -W`` succeeds and its object
inventory holds every home and every public module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = "opacus_lastiterate"
DIRECTIVE = re.compile(r"^```\{api-module\}\s+(\S+)\s*$", re.MULTILINE)

pytest.importorskip("lightning")  # the reference documents the adapters (extras lightning, hf)
pytest.importorskip("transformers")
sys.path.insert(0, str(DOCS / "_ext"))
public_api = importlib.import_module("public_api")


def _independent_public_modules() -> set[str]:
    """The walk, written out again here rather than taken from the extension."""
    root = importlib.import_module(PACKAGE)
    names = {PACKAGE}
    for info in pkgutil.walk_packages(root.__path__, f"{PACKAGE}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.add(info.name)
    return names


@cache
def _rendered() -> dict[str, list[str]]:
    """Module -> the api/ pages whose directives render it."""
    found: dict[str, list[str]] = {}
    for page in sorted((DOCS / "api").glob("*.md")):
        for module in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            found.setdefault(module, []).append(page.name)
    return found


def _assigns(module: str, name: str) -> bool:
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.target.id == name:
                return True
    return False


def test_every_public_module_is_rendered_once() -> None:
    modules = _independent_public_modules()
    rendered = _rendered()
    missing = sorted(modules - set(rendered))
    unknown = sorted(set(rendered) - modules)
    twice = {m: pages for m, pages in rendered.items() if len(pages) > 1}
    assert not missing, f"public modules without an api-module directive in docs/api/: {missing}"
    assert not unknown, f"api-module directives naming no public module: {unknown}"
    assert not twice, f"modules rendered more than once: {twice}"
    assert set(public_api.public_modules()) == modules


def test_every_exported_name_is_documented_at_a_rendered_home() -> None:
    api = public_api.public_api()
    exports = {
        m: tuple(getattr(importlib.import_module(m), "__all__", ()))
        for m in _independent_public_modules()
    }
    assert sum(map(len, exports.values())) > 400  # the walk sees the package
    problems = []
    for module, names in sorted(exports.items()):
        for name in names:
            obj = getattr(importlib.import_module(module), name)  # __all__ names resolve
            home = api.homes.get((module, name))
            if home is None or home not in _rendered():
                problems.append(f"{module}.{name}: home {home} is not rendered")
                continue
            if getattr(importlib.import_module(home), name, None) is not obj:
                problems.append(f"{module}.{name}: {home}.{name} is another object")
            defined_at = getattr(obj, "__module__", None) if (
                inspect.isclass(obj) or inspect.isroutine(obj)
            ) else None
            defines = defined_at == home or _assigns(home, name)
            private_origin = defined_at is not None and "._" in defined_at
            if not (defines or private_origin):
                problems.append(f"{module}.{name}: {home} does not define it")
            if (inspect.isclass(obj) or inspect.isroutine(obj)) and not obj.__doc__:
                problems.append(f"{home}.{name} has no docstring")
            if name not in api.documented_at(home):
                problems.append(f"{module}.{name}: not among the names rendered at {home}")
    assert not problems, "\n".join(problems)


def test_reexports_link_to_their_home() -> None:
    api = public_api.public_api()
    lines = "\n".join(public_api._rst_for(f"{PACKAGE}.analysis"))
    for name, home in api.reexported_at(f"{PACKAGE}.analysis"):
        assert f":py:obj:`{name} <{home}.{name}>`" in lines
    assert ("DPSGDRun", f"{PACKAGE}.analysis.run") in api.reexported_at(PACKAGE)
    assert f".. autoclass:: {PACKAGE}.analysis.run.DPSGDRun" in "\n".join(
        public_api._rst_for(f"{PACKAGE}.analysis.run")
    )


@pytest.mark.slow
def test_sphinx_build_has_no_warning_and_lists_every_name(tmp_path: Path) -> None:
    from sphinx.util.inventory import InventoryFile

    out = tmp_path / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
         str(DOCS), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with open(out / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", lambda base, uri: uri)
    data = getattr(inventory, "data", inventory)  # a dict up to Sphinx 9, an object later
    objects = {name for kind, entries in data.items() if kind.startswith("py:") for name in entries}
    api = public_api.public_api()
    missing = sorted({f"{home}.{name}" for (_, name), home in api.homes.items()} - objects)
    assert not missing, f"not in the built reference: {missing}"
    assert not sorted(_independent_public_modules() - objects)
