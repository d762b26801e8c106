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


def _imported_modules(path: Path) -> set[str]:
    """Every module of ``opacus_lastiterate`` the file imports, at any depth of the file
    (function-local and ``TYPE_CHECKING`` imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.startswith("opacus_lastiterate.")}


def test_the_subpackage_has_no_import_cycle() -> None:
    folder = Path(audit.__file__).parent
    modules = {f"opacus_lastiterate.analysis.audit.{p.stem}": p for p in folder.glob("*.py")}
    modules.pop("opacus_lastiterate.analysis.audit.__init__")
    graph = {m: _imported_modules(p) & set(modules) - {m} for m, p in modules.items()}
    # the result type is at the bottom: it imports no other module of the subpackage
    assert graph["opacus_lastiterate.analysis.audit.result"] == set()
    # depth-first search for a cycle
    state: dict[str, int] = {}

    def visit(module: str, path: tuple[str, ...]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            assert state.get(dep) != 1, f"import cycle: {' -> '.join((*path, dep))}"
            if dep not in state:
                visit(dep, (*path, dep))
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, (module,))
