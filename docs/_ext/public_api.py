"""Sphinx extension: the API reference, generated from the package's ``__all__`` lists.

Every public module (no path component starting with ``_``) is walked and every name in
its ``__all__`` is given one *home*: the public module that defines the object (for a
class or function its ``__module__``; for a constant or type alias the module whose source
assigns it, found by following the ``from ... import`` statements). Names defined in a
private module are at home in the deepest public module that exports them.

The directive ``api-module`` (in MyST: a ``{api-module}`` fence with the module's dotted name)
renders one module: its docstring, every object at home there (autodoc), and a list of the
names it re-exports, each linked to its home. Each object is therefore described once, and
every public name appears in the reference. At the end of reading, the extension checks
that every public module was rendered and every home holds its objects; a gap is a warning,
which ``-W`` turns into a failed build. ``tests/docs/test_api_reference.py`` uses the same
walk.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from dataclasses import dataclass
from functools import cache
from typing import Any

PACKAGE = "opacus_lastiterate"

__all__ = ["PACKAGE", "PublicApi", "home_module", "public_api", "public_modules", "setup"]


def _is_public(module: str) -> bool:
    return not any(part.startswith("_") for part in module.split("."))


def public_modules(package: str = PACKAGE) -> tuple[str, ...]:
    """The package and every submodule without a private component, in walk order."""
    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if _is_public(info.name):
            found.append(info.name)
    return tuple(found)


@cache
def _tree(module: str) -> ast.Module:
    source = inspect.getsource(importlib.import_module(module))
    return ast.parse(source)


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements, including those under ``if`` (``TYPE_CHECKING``) and ``try``."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out.extend(_statements(node.body) + _statements(node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_statements(node.body))
    return out


def _assigned_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if hasattr(ast, "TypeAlias") and isinstance(node, ast.TypeAlias):  # Python 3.12+
        return {node.name.id} if isinstance(node.name, ast.Name) else set()
    return set()


def _source_module(module: str, name: str, seen: frozenset[str] = frozenset()) -> str | None:
    """The module whose source defines ``name``, following ``from X import name`` from
    ``module``; None if it cannot be found (the name is then at home where it is exported)."""
    if module in seen:
        return None
    is_package = hasattr(importlib.import_module(module), "__path__")
    package = module if is_package else module.rpartition(".")[0]
    for node in _statements(_tree(module).body):
        if name in _assigned_names(node):
            return module
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                target = node.module or ""
                if node.level:
                    target = f"{base}.{target}" if target else base
                if not target.startswith(PACKAGE):
                    return None
                return _source_module(target, alias.name, seen | {module})
    return None


def home_module(module: str, name: str, exporters: tuple[str, ...] = ()) -> str:
    """The public module where ``module.name`` is documented (see the module docstring).

    ``exporters``: the public modules whose ``__all__`` lists the name (the fallback for
    objects defined in private modules: the deepest of them that holds the same object).
    """
    obj = getattr(importlib.import_module(module), name)
    defining: str | None = None
    if inspect.isclass(obj) or inspect.isroutine(obj):
        defining = getattr(obj, "__module__", None)
    if defining is None or not defining.startswith(PACKAGE):
        defining = _source_module(module, name)
    if defining is not None and _is_public(defining):
        return defining
    same = [
        m for m in exporters if getattr(importlib.import_module(m), name, None) is obj
    ] or [module]
    return max(same, key=lambda m: (m.count("."), m))


@dataclass(frozen=True)
class PublicApi:
    """Every public module, its ``__all__`` and the home of each exported name."""

    modules: tuple[str, ...]
    exports: dict[str, tuple[str, ...]]  # module -> __all__ (empty when it has none)
    homes: dict[tuple[str, str], str]  # (module, name) -> home module

    def documented_at(self, module: str) -> list[str]:
        """Names whose objects are described at ``module``, in source order."""
        names = {name for (_, name), home in self.homes.items() if home == module}
        order: dict[str, int] = {}
        for node in _statements(_tree(module).body):
            for assigned in _assigned_names(node):
                order.setdefault(assigned, node.lineno)
        return sorted(names, key=lambda n: (order.get(n, 10**9), n))

    def reexported_at(self, module: str) -> list[tuple[str, str]]:
        """(name, home) of the names ``module`` exports but does not describe itself."""
        return [
            (name, self.homes[module, name])
            for name in self.exports[module]
            if self.homes[module, name] != module
        ]


@cache
def public_api(package: str = PACKAGE) -> PublicApi:
    """Walk the package once (imports every public module, torch and the adapters included)."""
    modules = public_modules(package)
    exports = {
        m: tuple(getattr(importlib.import_module(m), "__all__", ())) for m in modules
    }
    exporters: dict[str, list[str]] = {}
    for m, names in exports.items():
        for name in names:
            exporters.setdefault(name, []).append(m)
    homes = {
        (m, name): home_module(m, name, tuple(exporters[name]))
        for m, names in exports.items()
        for name in names
    }
    return PublicApi(modules, exports, homes)


# --- Sphinx -------------------------------------------------------------------------------


def _directive_for(obj: Any) -> str:
    if inspect.isclass(obj):
        return "autoexception" if issubclass(obj, BaseException) else "autoclass"
    if inspect.isroutine(obj):
        return "autofunction"
    return "autodata"


def _rst_for(module: str) -> list[str]:
    api = public_api()
    if module not in api.exports:
        raise ValueError(f"{module} is not a public module of {PACKAGE}")
    mod = importlib.import_module(module)
    lines = [f".. automodule:: {module}", ""]
    for name in api.documented_at(module):
        obj = getattr(mod, name)
        kind = _directive_for(obj)
        lines.append(f".. {kind}:: {module}.{name}")
        if kind in ("autoclass", "autoexception"):
            lines += ["   :members:", "   :show-inheritance:"]
        elif kind == "autodata" and len(repr(obj)) > 70:
            lines.append("   :no-value:")
        lines.append("")
    reexported = api.reexported_at(module)
    if reexported:
        lines += [".. rubric:: Also importable from here", ""]
        for name, home in reexported:
            lines.append(f"* :py:obj:`{name} <{home}.{name}>` (documented in :py:mod:`{home}`)")
        lines.append("")
    return lines


def setup(app: Any) -> dict[str, Any]:
    from docutils import nodes
    from docutils.parsers.rst.states import RSTState
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective
    from sphinx.util.nodes import nested_parse_with_titles

    logger = logging.getLogger(__name__)

    class ApiModule(SphinxDirective):
        """``api-module``: one public module, rendered from its ``__all__``."""

        required_arguments = 1
        has_content = False

        def run(self) -> list[nodes.Node]:
            module = self.arguments[0]
            try:
                lines = _rst_for(module)
            except (ImportError, ValueError) as error:
                logger.warning("api-module %s: %s", module, error, location=self.get_location())
                return []
            rendered = getattr(self.env, "public_api_rendered", {})
            rendered[module] = self.env.docname
            self.env.public_api_rendered = rendered  # type: ignore[attr-defined]
            container = nodes.container()
            source = self.get_source_info()[0] or "api-module"
            if not isinstance(self.state, RSTState):  # MyST: let eval-rst read the reST
                lines = ["```{eval-rst}", *lines, "```"]
            content = StringList(lines, source=f"{source} (api-module {module})")
            nested_parse_with_titles(self.state, content, container)
            return list(container.children)

    def purge(app: Any, env: Any, docname: str) -> None:
        rendered = getattr(env, "public_api_rendered", {})
        for module in [m for m, doc in rendered.items() if doc == docname]:
            del rendered[module]

    def merge(app: Any, env: Any, docnames: Any, other: Any) -> None:
        rendered = getattr(env, "public_api_rendered", {})
        rendered.update(getattr(other, "public_api_rendered", {}))
        env.public_api_rendered = rendered

    def check(app: Any, env: Any) -> None:
        api = public_api()
        rendered = getattr(env, "public_api_rendered", {})
        objects = env.get_domain("py").objects
        for module in api.modules:
            if module not in rendered:
                logger.warning("public module %s is not in the API reference "
                               "(add an api-module directive to a page of docs/api/)", module)
        for (module, name), home in sorted(api.homes.items()):
            if home in rendered and f"{home}.{name}" not in objects:
                logger.warning("%s.%s (documented at %s) did not render; does it have a "
                               "docstring?", module, name, home)

    app.add_directive("api-module", ApiModule)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("env-check-consistency", check)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
