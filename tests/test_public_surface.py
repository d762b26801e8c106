"""The root's public names: few, each listed once, each the object of its subpackage, and
typed by the stub ``opacus_lastiterate/__init__.pyi`` with exactly the same names."""

from __future__ import annotations

import ast
import importlib
import re
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


# -- every public name is one a user meets -----------------------------------------------------

REPO = ROOT.parent
USER_FACING = ("README.md", "docs/*.md", "examples/*.py", "benchmarks/*.py", "scripts/*.py",
               "scripts/*.sh", "reproductions/*.py")


def _user_words() -> set[str]:
    """Identifiers of the material a user reads or runs (the architecture map excluded: it
    names internals on purpose)."""
    text = []
    for pattern in USER_FACING:
        for path in sorted(REPO.glob(pattern)):
            if path.stem != "architecture":
                text.append(path.read_text(encoding="utf-8", errors="replace"))
    return set(re.findall(r"[A-Za-z_]\w*", "\n".join(text)))


def _public_exports() -> dict[str, list[str]]:
    """Name -> the public modules whose ``__all__`` lists it."""
    out: dict[str, list[str]] = {}
    for name in opacus_lastiterate.__all__:  # the root's list is built from its lazy table
        out.setdefault(name, []).append("opacus_lastiterate/__init__.py")
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts == ("__init__",) or any(p.startswith("_") and p != "__init__" for p in parts):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__all__" for t in node.targets
            ):
                for name in ast.literal_eval(node.value):
                    out.setdefault(name, []).append(str(path.relative_to(REPO)))
    return out


def _signature_names(node: ast.AST) -> set[str]:
    """Identifiers in the annotations of a function's parameters and return, or of a class's
    bases, public fields and public methods (``__init__`` included)."""
    functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    annotations: list[ast.AST] = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        functions.append(node)
    elif isinstance(node, ast.ClassDef):
        annotations.extend(node.bases)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not item.name.startswith("_") or item.name == "__init__"
            ):
                functions.append(item)
            elif isinstance(item, ast.AnnAssign) and not getattr(item.target, "id", "_").startswith("_"):
                annotations.append(item.annotation)
    for f in functions:
        arguments = f.args.posonlyargs + f.args.args + f.args.kwonlyargs
        annotations.extend(a.annotation for a in arguments if a.annotation is not None)
        if f.returns is not None:
            annotations.append(f.returns)
    names: set[str] = set()
    for annotation in annotations:
        for sub in ast.walk(annotation):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                names.update(re.findall(r"[A-Za-z_]\w*", sub.value))
    return names


def test_every_public_name_is_met_by_a_user() -> None:
    """A name is public (in a public module's ``__all__``) only if the README, a docs page, an
    example, a benchmark or a script uses it, or it appears in the signature of a public name
    that is (a return type, a parameter's type), or its ``_delta``/``_epsilon`` twin is;
    everything else stays out of ``__all__`` (internal to the package), and the exceptions
    module lists every warning and error."""
    met = _user_words()
    definitions: dict[str, list[ast.AST]] = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                definitions.setdefault(node.name, []).append(node)
    grown = True
    while grown:
        grown = False
        for name in list(met):
            for node in definitions.get(name, ()):
                new = _signature_names(node) - met
                if new:
                    met |= new
                    grown = True
    twins = (("_delta", "_epsilon"), ("_epsilon", "_delta"))
    unmet = {
        name: modules
        for name, modules in _public_exports().items()
        if name not in met
        and not any(name.endswith(a) and name[: -len(a)] + b in met for a, b in twins)
        and modules != ["opacus_lastiterate/exceptions.py"]
    }
    assert not unmet, f"public names no user meets (document them or drop them from __all__): {unmet}"


def test_the_package_lists_few_distinct_public_names() -> None:
    # 585 before the rule above, 341 before issue 32 (type aliases, internal result types and
    # helpers only explained or only used by maintainers' scripts left __all__); a new
    # capability adds the names its users meet
    assert len(_public_exports()) <= 241
