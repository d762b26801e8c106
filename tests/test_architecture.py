"""The package's architecture, checked statically: every module is parsed (``ast``), nothing
of ``opacus_lastiterate`` is imported, so these tests take well under a second.

The import graph (:func:`tests._architecture.import_graph`) has an edge A -> B for every
import of B by A, wherever it is written: at module level, inside functions and methods
("function-local", runs when the function is called), in try/except and if/else blocks.

* ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) are edges to ``a.b.c``;
  ``from a.b import name`` (``name`` an attribute) is an edge to the package ``a.b``'s
  ``__init__``; relative imports are resolved against the importing module's package.
* Lazy names (PEP 562): a package's ``_LAZY`` table (``opacus_lastiterate/_lazy.py``, and
  the hand-written ``__getattr__`` of ``callbacks``) maps a public name to the module that
  defines it. Using the name is an import of that module: ``from opacus_lastiterate.analysis
  import DPSGDRun`` is an edge to ``analysis`` and one to ``analysis.run``; so is the
  attribute ``analysis.DPSGDRun`` of an imported package, and ``pkg.sub`` for a submodule
  reached as an attribute. A ``_LAZY`` table is *not* an edge of the package ``__init__``
  itself: it imports nothing until a name is used, and the edge belongs to the user.
* ``importlib.import_module("literal")`` (or a module-level string constant) is an edge
  (``_opacus_hook`` -> ``accountants``); names computed at run time are not followed.
* Parent packages are not edges. Importing ``a.b.c`` runs ``a/__init__`` and
  ``a/b/__init__`` first, but counting that would make every module of a package whose
  ``__init__`` imports its submodules part of a cycle (``cli/__init__`` -> ``cli._app`` ->
  ``cli._epsilon`` -> ``cli/__init__``) although no module ever sees a partly initialised
  one. A submodule that imports an *attribute* of its own package's ``__init__`` gets the
  explicit edge above, so that real cycle is caught.
* ``if TYPE_CHECKING:`` imports never run. :func:`test_no_import_cycles` leaves them out:
  it is about what Python executes (a cycle there means a partly initialised module, or an
  import order that works by accident). :func:`test_no_import_cycles_through_type_only_imports`
  adds them and reports only the cycles that need one: a module whose annotations name a
  higher module of the same folder is a design tangle even though it runs.
  :func:`test_imports_only_go_down_the_layers` counts them: a lower layer should not even
  name a higher layer's types.

Layers (:data:`LAYERS`, lowest first; a module may import its own layer and lower ones):

* ``base``: ``exceptions`` (every warning and error class), ``_warn`` (warning attribution),
  ``_lazy`` (PEP 562 helpers), ``_json``, ``_requires`` (the error of a part imported
  without torch) and ``_append_file`` (the crash-safe appending writer of the monitor's file
  sinks and the audit's record files): imported by every layer, import nothing of the
  package but each other.
* ``analysis``: the mathematics (numpy, scipy, dp_accounting; no torch).
* ``schedules``: reads rates and momentum from real torch optimisers into the weights of
  ``analysis.last_iterate.optimizer_weights``; used by ``accountants`` (and above).
  ``samplers`` (the balls-in-bins batch sampler, torch only) and ``user_samplers`` (user-level
  sampling) share the layer.
* ``accountants``: the Opacus accountants.
* ``package root``: ``opacus_lastiterate/__init__`` (re-exports names of ``analysis`` and
  ``accountants``) and ``_opacus_hook`` (imports ``accountants`` when Opacus is imported).
  Above ``accountants`` so that no accountant imports the root facade that registers it.
* ``auditing``: attacks, simulator, many-run runner.
* ``callbacks``: the training-time monitor and adapters.
* ``figures``: the papers' figures and tables, recomputed from ``analysis`` and ``auditing``
  (``cebere_fig4``, ``last_iterate_fig3``); only the CLI's ``reproduce`` and ``plan`` use
  them. Above ``callbacks``: monitoring during training must not depend on figure code.
* ``cli``: the command line, and ``__main__``.

Private names (:func:`test_no_private_access_across_modules`, in ``callbacks/`` and
``auditing/``): modules talk through public APIs. Flagged:

* ``X._name`` (read, write or delete; ``_name`` starts with one underscore or is
  name-mangled, dunders are public) where ``X`` is not ``self``, ``cls``, ``super()``,
  ``type(self)`` or ``self.__class__``, unless this module defines ``_name`` (a module-level
  name; a method, class attribute, field or ``__slots__`` entry of one of its classes; an
  attribute it assigns on ``self``/``cls``): then the object is most likely one of this
  module's own classes. Where ``X`` is an imported module, the module's folder decides, as
  for imports. Objects of other libraries (Opacus, multiprocessing) count too: their private
  attributes change without notice.
* ``getattr``/``setattr``/``hasattr``/``delattr`` of a literal private name, by the same rule.
* ``from module import _name`` where ``module`` (or the submodule ``_name``) lives in another
  folder of the package, or outside it. Private helpers shared within one folder are allowed
  (a folder is one component with one public face). :data:`SHARED_PRIVATE_MODULES` are
  package-wide private utilities, importable from every layer: ``analysis/_validation.py``
  is the argument checking of the whole package (its docstring says so; every layer
  validates with the same messages), ``_warn`` and ``_lazy`` are the base layer. Their
  names are public; they are private only to the package's users.

Each checker has self-tests on synthetic packages, so that a green run means no violations
and not a checker that sees nothing. The package tests assert zero violations: there is no
allow-list, and a failure prints each violation with its file and line.
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest

from tests._architecture import (
    ImportGraph,
    Module,
    cycles,
    format_cycle,
    import_graph,
    layer_violations,
    lazy_table,
    load_package,
    private_access_violations,
)

PACKAGE = "opacus_lastiterate"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", (f"{PACKAGE}.exceptions", f"{PACKAGE}._warn", f"{PACKAGE}._lazy", f"{PACKAGE}._json",
              f"{PACKAGE}._append_file", f"{PACKAGE}._requires")),
    ("analysis", (f"{PACKAGE}.analysis",)),
    ("schedules", (f"{PACKAGE}.schedules", f"{PACKAGE}.samplers", f"{PACKAGE}.user_samplers")),
    ("accountants", (f"{PACKAGE}.accountants",)),
    ("package root", (PACKAGE, f"{PACKAGE}._opacus_hook")),
    ("auditing", (f"{PACKAGE}.auditing",)),
    ("callbacks", (f"{PACKAGE}.callbacks",)),
    ("figures", (f"{PACKAGE}.figures",)),
    ("cli", (f"{PACKAGE}.cli", f"{PACKAGE}.__main__")),
)
"""Lowest first. An entry covers its subpackages; the top-level package only its __init__."""

PRIVATE_ACCESS_FOLDERS = ("callbacks", "auditing")
THIRD_PARTY_PRIVATE: dict[str, str] = {
    # "path:expression" -> why there is no public way; each is a documented exception
    "opacus_lastiterate/auditing/opacus_releases/_driver.py:engine._set_seed": (
        "Opacus 0.x, probed as released: its PrivacyEngine has no public way to seed the noise"
    ),
    "opacus_lastiterate/auditing/runner/process_pool.py:"
    'getattr(multiprocessing.current_process(), "_inheriting", False)': (
        "the flag multiprocessing itself reads to refuse a start while the main module is "
        "imported (_check_not_importing_main); there is no public equivalent"
    ),
}
"""Private attributes of other libraries that a module must read, with the reason."""

SHARED_PRIVATE_MODULES = (
    f"{PACKAGE}.analysis._validation",
    f"{PACKAGE}.analysis._bisection",
    f"{PACKAGE}._warn",
    f"{PACKAGE}._lazy",
)


@pytest.fixture(scope="module")
def modules() -> dict[str, Module]:
    return load_package(ROOT)


@pytest.fixture(scope="module")
def graph(modules: dict[str, Module]) -> ImportGraph:
    return import_graph(modules)


def _report(title: str, lines: list[str]) -> str:
    return f"{title} ({len(lines)}):\n" + "\n".join(lines)


# -- the package -----------------------------------------------------------------------------


def test_no_import_cycles(graph: ImportGraph) -> None:
    runtime = graph.outgoing(include_type_only=False)
    found = cycles(runtime)
    assert not found, _report(
        "import cycles (function-local imports included, TYPE_CHECKING excluded)",
        [format_cycle(c, runtime) for c in found],
    )


def test_no_import_cycles_through_type_only_imports(graph: ImportGraph) -> None:
    runtime = graph.outgoing(include_type_only=False)
    full = graph.outgoing(include_type_only=True)
    found = [
        c for c in cycles(full)
        if any(b not in runtime[a] for a, b in itertools.pairwise(c))
    ]  # fmt: skip
    assert not found, _report(
        "import cycles closed by `if TYPE_CHECKING:` imports",
        [format_cycle(c, full) for c in found],
    )


def test_every_module_has_a_layer(graph: ImportGraph) -> None:
    _, unassigned = layer_violations(graph, LAYERS, PACKAGE)
    assert not unassigned, f"modules in no layer of LAYERS (add them): {unassigned}"


def test_imports_only_go_down_the_layers(graph: ImportGraph) -> None:
    order = " -> ".join(name for name, _ in LAYERS)
    violations, _ = layer_violations(graph, LAYERS, PACKAGE)
    assert not violations, _report(
        f"imports of a higher layer (layers, lowest first: {order})",
        [str(v) for v in violations],
    )


def test_no_private_access_across_modules(modules: dict[str, Module]) -> None:
    lines = []
    for name in sorted(modules):
        folder = name.split(".")[1] if "." in name else ""
        if folder in PRIVATE_ACCESS_FOLDERS:
            found = private_access_violations(modules[name], modules, SHARED_PRIVATE_MODULES)
            lines.extend(str(v) for v in found if _allowance(str(v)) is None)
    assert not lines, _report(
        f"private names of other modules used in {', '.join(PRIVATE_ACCESS_FOLDERS)}", lines
    )


def _allowance(violation: str) -> str | None:
    """The documented reason for a third-party private access (``path:line: expr``)."""
    path, _, rest = violation.partition(":")
    _, _, expression = rest.partition(": ")
    return THIRD_PARTY_PRIVATE.get(f"{path}:{expression}")


def test_third_party_exceptions_are_still_needed(modules: dict[str, Module]) -> None:
    """Each documented exception still matches a use (a stale one would excuse a new one)."""
    found = {
        f"{str(v).partition(':')[0]}:{str(v).partition(': ')[2]}"
        for name, module in modules.items()
        if (name.split(".")[1] if "." in name else "") in PRIVATE_ACCESS_FOLDERS
        for v in private_access_violations(module, modules, SHARED_PRIVATE_MODULES)
    }
    assert set(THIRD_PARTY_PRIVATE) <= found, set(THIRD_PARTY_PRIVATE) - found


def test_lazy_tables_are_read(modules: dict[str, Module]) -> None:
    """Every package that resolves names lazily has its table parsed (a new table format
    would otherwise hide lazy import edges), and every name points at a module that exists."""
    with_tables = [m for m in modules.values() if m.is_package and "_LAZY" in m.path.read_text()]
    assert {m.name for m in with_tables} >= {
        PACKAGE, f"{PACKAGE}.analysis", f"{PACKAGE}.auditing", f"{PACKAGE}.callbacks"
    }  # fmt: skip
    for module in with_tables:
        table = lazy_table(module)
        assert table, f"{module.display}: _LAZY is not a dict literal this test can read"
        missing = sorted({t for t in table.values() if t not in modules})
        assert not missing, f"{module.display}: _LAZY names modules that do not exist: {missing}"


def test_import_module_of_a_constant_is_an_edge(graph: ImportGraph) -> None:
    edges = graph.outgoing(include_type_only=False)
    assert f"{PACKAGE}.accountants" in edges[f"{PACKAGE}._opacus_hook"]


# -- self-tests of the checkers on synthetic packages ----------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    for rel, source in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return load_package(tmp_path / "pkg")


def _cycles(modules: dict[str, Module], include_type_only: bool = False) -> list[list[str]]:
    return cycles(import_graph(modules).outgoing(include_type_only))


def test_cycle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import g\n",
        "b.py": "def g():\n    from pkg.a import f\n    return f\n",
    })  # fmt: skip
    graph = import_graph(modules).outgoing(include_type_only=False)
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]
    message = format_cycle(["pkg.a", "pkg.b", "pkg.a"], graph)
    assert "pkg/b.py:2: from pkg.a import f  [function-local]" in message


@pytest.mark.parametrize(
    ("use", "expected"),
    [
        ("from . import f", [["pkg.a", "pkg.b", "pkg.a"]]),  # a lazy name of pkg
        ("import pkg\n    return pkg.f", [["pkg.a", "pkg.b", "pkg.a"]]),  # as an attribute
        ("from pkg import a", [["pkg.a", "pkg.b", "pkg.a"]]),  # a submodule
        ("from pkg import VERSION", []),  # an attribute of pkg/__init__ only
    ],
)
def test_relative_imports_and_lazy_names_are_edges(
    tmp_path: Path, use: str, expected: list[list[str]]
) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "_LAZY = {**dict.fromkeys(('f', 'g'), 'a')}\n",
        "a.py": "from .b import h\ndef f(): pass\n",
        "b.py": f"def h():\n    {use}\n",
    })  # fmt: skip
    assert _cycles(modules) == expected


def test_type_checking_imports_and_parent_packages_make_no_runtime_cycle(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "from pkg.a import f\n",
        "a.py": (
            "from typing import TYPE_CHECKING\nfrom pkg.b import g\n"
            "if TYPE_CHECKING:\n    from pkg.c import C\nelse:\n    import json\ndef f(): pass\n"
        ),
        "b.py": "import pkg.d\ndef g(): pass\n",  # runs pkg/__init__ first: not an edge
        "c.py": "from pkg.a import f\nclass C: pass\n",
        "d.py": "X = 1\n",
    })  # fmt: skip
    assert _cycles(modules) == []
    assert _cycles(modules, include_type_only=True) == [["pkg.a", "pkg.c", "pkg.a"]]


def test_a_submodule_importing_an_attribute_of_its_eager_parent_is_a_cycle(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "from pkg.a import f\nVERSION = 1\n",
        "a.py": "def f():\n    from pkg import VERSION\n    return VERSION\n",
    })  # fmt: skip
    assert _cycles(modules) == [["pkg", "pkg.a", "pkg"]]


def test_layer_checker_flags_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/m.py": "def f():\n    from pkg.high.n import g\n    return g\n",
        "high/__init__.py": "from pkg.low.m import f\n",
        "high/n.py": "from ..low import m\ndef g(): pass\n",
        "stray.py": "",
    })  # fmt: skip
    layers = (("low", ("pkg.low",)), ("high", ("pkg", "pkg.high")))
    violations, unassigned = layer_violations(import_graph(modules), layers, "pkg")
    assert [str(v) for v in violations] == [
        "pkg/low/m.py:2: from pkg.high.n import g  (low imports high: pkg.high.n, function-local)"
    ]
    assert unassigned == ["pkg.stray"]


def test_private_access_checker(tmp_path: Path) -> None:
    modules = _package(tmp_path, {
        "__init__.py": "",
        "analysis/__init__.py": "",
        "analysis/_validation.py": "def check(): pass\n",
        "analysis/helpers.py": "def _helper(): pass\ndef _internal(): pass\n",
        "callbacks/__init__.py": "",
        "callbacks/sibling.py": "def _shared(): pass\n",
        "callbacks/mod.py": """\
            import os
            from pkg.analysis.helpers import _helper
            from pkg.callbacks.sibling import _shared
            from pkg.analysis._validation import check
            from pkg.analysis import _validation
            from pkg.analysis import helpers
            from . import sibling

            class Mine:
                _count = 0
                __slots__ = ("_x", "_y")

                def __init__(self, other):
                    self._x = 1
                    self._y = other._y
                    other._z = 2
                    super()._w
                    type(self)._count
                    self.__class__._count
                    getattr(other, "_secret")
                    setattr(other, "_secret", 1)
                    getattr(self, "_secret")
                    helpers._internal()
                    sibling._shared()
                    other.__dict__
                    other.public._x
                    os._exit(0)
            """,
    })  # fmt: skip
    found = private_access_violations(
        modules["pkg.callbacks.mod"], modules, ["pkg.analysis._validation"]
    )
    assert [str(v) for v in found] == [
        "pkg/callbacks/mod.py:2: from pkg.analysis.helpers import _helper"
        "  (private name of pkg.analysis.helpers)",
        "pkg/callbacks/mod.py:16: other._z",
        'pkg/callbacks/mod.py:20: getattr(other, "_secret")',
        'pkg/callbacks/mod.py:21: setattr(other, "_secret", 1)',
        "pkg/callbacks/mod.py:23: helpers._internal  (private name of pkg.analysis.helpers)",
        "pkg/callbacks/mod.py:27: os._exit  (private name of os (outside the package))",
    ]


MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """One concept per module, and a module a reader takes in at once."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
