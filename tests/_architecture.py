"""Static architecture checks of a Python package: its import graph (cycles, layers) and
accesses to other modules' private names. AST only: nothing of the checked package is
imported. Used by ``tests/test_architecture.py``, which documents the rules.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Edge",
    "ImportGraph",
    "Module",
    "Violation",
    "cycles",
    "format_cycle",
    "import_graph",
    "is_private",
    "layer_violations",
    "lazy_table",
    "load_package",
    "private_access_violations",
]


# -- modules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str  # dotted name, "pkg.sub.mod"; a package's __init__ has the package's name
    path: Path
    display: str  # the path shown in messages (relative to the package's parent directory)
    is_package: bool
    tree: ast.Module

    @property
    def package(self) -> str:
        """The package its relative imports resolve against."""
        return self.name if self.is_package else self.name.rpartition(".")[0]

    @property
    def folder(self) -> Path:
        return self.path.parent


def load_package(root: Path) -> dict[str, Module]:
    """Every module of the package in directory ``root`` (named after the directory)."""
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = rel.with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, path, rel.as_posix(), is_package, tree)
    return modules


def _segment(lines: Sequence[str], node: ast.AST) -> str:
    """The source text of ``node``, on one line (``ast.get_source_segment`` re-splits the
    whole file on every call)."""
    start, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    if start is None or end is None:
        return ast.unparse(node)
    first, last = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    if start == end:
        text = lines[start - 1].encode()[first:last].decode()
    else:
        chunk = [lines[start - 1].encode()[first:].decode(), *lines[start:end - 1],
                 lines[end - 1].encode()[:last].decode()]  # fmt: skip
        text = " ".join(chunk)
    return " ".join(text.split())


def is_private(name: str) -> bool:
    """``_name`` or ``__name`` (single leading underscore or name-mangled), not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _str_constant(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _lazy_entries(node: ast.AST) -> Iterable[tuple[str, str]]:
    """``name -> module`` pairs of a ``_LAZY`` dict literal: plain ``"name": "module"``
    entries, nested ``**{...}`` and ``**dict.fromkeys((names...), "module")``."""
    if not isinstance(node, ast.Dict):
        return
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:
            if isinstance(value, ast.Dict):
                yield from _lazy_entries(value)
            elif (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "fromkeys"
                and len(value.args) == 2
                and isinstance(value.args[0], ast.Tuple | ast.List | ast.Set)
                and (module := _str_constant(value.args[1])) is not None
            ):
                for element in value.args[0].elts:
                    if (name := _str_constant(element)) is not None:
                        yield name, module
        elif (name := _str_constant(key)) is not None and (module := _str_constant(value)):
            yield name, module


def lazy_table(module: Module) -> dict[str, str]:
    """The module-level ``_LAZY`` table of a package ``__init__`` (public name -> absolute
    module), resolved as ``opacus_lastiterate._lazy.lazy_attributes`` resolves it: a module
    name not starting with the package's name is relative to it."""
    table: dict[str, str] = {}
    if not module.is_package:
        return table
    for stmt in module.tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
        value = getattr(stmt, "value", None)
        if value is None or not any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in targets):
            continue
        for name, target in _lazy_entries(value):
            if not target.startswith(module.name + ".") and target != module.name:
                target = f"{module.name}.{target}"
            table[name] = target
    return table


# -- the import graph ------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    display: str  # file of the importing module
    line: int
    text: str  # the statement or expression that imports
    local: bool  # inside a function: runs when the function is called
    type_only: bool  # under ``if TYPE_CHECKING:``: never runs
    lazy: bool  # through a package's ``_LAZY`` table (a name resolved on first use)

    def describe(self) -> str:
        tags = [t for t, on in (("function-local", self.local), ("TYPE_CHECKING", self.type_only),
                                ("lazy name", self.lazy)) if on]  # fmt: skip
        return f"{self.display}:{self.line}: {self.text}" + (
            f"  [{', '.join(tags)}]" if tags else ""
        )


class ImportGraph:
    def __init__(self, modules: Mapping[str, Module]) -> None:
        self.modules = modules
        self.lazy = {name: lazy_table(m) for name, m in modules.items() if m.is_package}
        self.edges: list[Edge] = []
        self.seen: set[Edge] = set()

    def resolve_name(self, package: str, name: str) -> list[tuple[str, bool]]:
        """Modules that ``from package import name`` runs: the submodule ``package.name``
        if there is one; otherwise ``package`` itself and, for a name of its ``_LAZY`` table,
        the module defining the name (followed through further ``_LAZY`` tables).
        Pairs (module, through a lazy table)."""
        if package not in self.modules:
            return []
        if f"{package}.{name}" in self.modules:
            return [(f"{package}.{name}", False)]
        out = [(package, False)]
        seen = {package}
        target = self.lazy.get(package, {}).get(name)
        while target is not None and target in self.modules and target not in seen:
            seen.add(target)
            out.append((target, True))
            target = self.lazy.get(target, {}).get(name)
        return out

    def outgoing(self, include_type_only: bool) -> dict[str, dict[str, list[Edge]]]:
        graph: dict[str, dict[str, list[Edge]]] = {name: {} for name in self.modules}
        for edge in self.edges:
            if edge.source != edge.target and (include_type_only or not edge.type_only):
                graph[edge.source].setdefault(edge.target, []).append(edge)
        return graph


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _ImportCollector(ast.NodeVisitor):
    """Every import of one module: statements anywhere (module level, functions, methods,
    try/except, ``if TYPE_CHECKING:``), ``importlib.import_module("literal")`` (or a
    module-level string constant), and attributes of an imported package that resolve to
    a submodule or a ``_LAZY`` name (``analysis.DPSGDRun``)."""

    def __init__(self, graph: ImportGraph, module: Module) -> None:
        self.graph = graph
        self.module = module
        self.depth = 0
        self.type_only = 0
        self.aliases: dict[str, str] = {}  # local name -> the module it is bound to
        self.constants = {
            t.id: v
            for s in module.tree.body
            if isinstance(s, ast.Assign) and (v := _str_constant(s.value)) is not None
            for t in s.targets
            if isinstance(t, ast.Name)
        }
        self.skip_annotations = any(
            isinstance(s, ast.ImportFrom) and s.module == "__future__"
            and any(a.name == "annotations" for a in s.names)
            for s in module.tree.body
        )  # fmt: skip

    def add(self, node: ast.AST, target: str, lazy: bool = False) -> None:
        if target not in self.graph.modules:
            return
        text = _segment(self._lines, node)
        edge = Edge(self.module.name, target, self.module.display, getattr(node, "lineno", 0),
                    text, self.depth > 0, self.type_only > 0, lazy)  # fmt: skip
        if edge not in self.graph.seen:
            self.graph.seen.add(edge)
            self.graph.edges.append(edge)

    def run(self) -> None:
        self._lines = self.module.path.read_text(encoding="utf-8").splitlines()
        self.visit(self.module.tree)

    # scopes
    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        for decorator in getattr(node, "decorator_list", ()):
            self.visit(decorator)  # run at definition time
        for default in [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]:
            self.visit(default)
        if not self.skip_annotations:
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        node.args.vararg, node.args.kwarg]:  # fmt: skip
                if arg is not None and arg.annotation is not None:
                    self.visit(arg.annotation)
            if getattr(node, "returns", None) is not None:
                self.visit(node.returns)  # type: ignore[union-attr,arg-type]
        self.depth += 1
        for stmt in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(stmt)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if not self.skip_annotations:
            self.visit(node.annotation)
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.type_only += 1
        for stmt in node.body:
            self.visit(stmt)
        self.type_only -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    # imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(node, alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.partition(".")[0]
                self.aliases[top] = top

    def _base(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.module.package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node)
        for alias in node.names:
            if alias.name == "*":
                self.add(node, base)
                for target in set(self.graph.lazy.get(base, {}).values()):
                    self.add(node, target, lazy=True)
                continue
            for target, lazy in self.graph.resolve_name(base, alias.name):
                self.add(node, target, lazy)
            if f"{base}.{alias.name}" in self.graph.modules:
                self.aliases[alias.asname or alias.name] = f"{base}.{alias.name}"

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if not (isinstance(root, ast.Name) and root.id in self.aliases):
            self.generic_visit(node)
            return
        current = self.aliases[root.id]
        reached: list[tuple[str, bool]] = []
        for attr in reversed(chain):
            resolved = self.graph.resolve_name(current, attr)
            if not resolved:
                break
            if resolved == [(f"{current}.{attr}", False)]:  # a submodule: keep walking
                current = resolved[0][0]
                reached = resolved
                continue
            reached = [r for r in resolved if r[1]]  # a lazy name; plain attributes add nothing
            break
        # Parent packages walked through are not edges (see test_architecture's docstring);
        # the import that bound the alias has its own edge.
        for target, lazy in reached:
            self.add(node, target, lazy)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name == "import_module" and node.args:
            arg = node.args[0]
            target = _str_constant(arg)
            if target is None and isinstance(arg, ast.Name):
                target = self.constants.get(arg.id)
            if target is not None and not target.startswith("."):
                self.add(node, target)
        self.generic_visit(node)


def import_graph(modules: Mapping[str, Module]) -> ImportGraph:
    graph = ImportGraph(modules)
    for module in modules.values():
        _ImportCollector(graph, module).run()
    return graph


# -- cycles ----------------------------------------------------------------------------------


def _strongly_connected(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return sorted(out)


def cycles(graph: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """For every module on a cycle, the shortest cycle through it, each cycle once (a path
    ``[a, b, ..., a]``), grouped by strongly connected component."""
    found: list[list[str]] = []
    for component in _strongly_connected(graph):
        members = set(component)
        seen: set[tuple[str, ...]] = set()
        for start in component:
            parent: dict[str, str] = {}
            queue = deque([start])
            path: list[str] | None = None
            while queue and path is None:
                node = queue.popleft()
                for nxt in sorted(graph[node]):
                    if nxt not in members:
                        continue
                    if nxt == start:
                        path = [node]
                        while path[-1] != start:
                            path.append(parent[path[-1]])
                        path.reverse()
                        break
                    if nxt not in parent:
                        parent[nxt] = node
                        queue.append(nxt)
            assert path is not None
            i = path.index(min(path))
            key = tuple(path[i:] + path[:i])
            if key not in seen:
                seen.add(key)
                found.append([*key, key[0]])
    return found


def format_cycle(cycle: Sequence[str], graph: Mapping[str, Mapping[str, Sequence[Edge]]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in itertools.pairwise(cycle):
        lines.append(f"    {a} -> {b}: " + "; ".join(e.describe() for e in graph[a][b]))
    return "\n".join(lines)


# -- layers ----------------------------------------------------------------------------------


def layer_of(module: str, layers: Sequence[tuple[str, Sequence[str]]], top: str) -> int | None:
    """Rank of ``module`` in ``layers`` (lowest first); the most specific entry wins. An
    entry covers its subpackages and submodules, except the top-level package, which covers
    only its own ``__init__``."""
    best: tuple[int, int] | None = None  # (length of the entry, rank)
    for rank, (_, members) in enumerate(layers):
        for entry in members:
            covers = module == entry or (entry != top and module.startswith(entry + "."))
            if covers and (best is None or len(entry) > best[0]):
                best = (len(entry), rank)
    return None if best is None else best[1]


@dataclass(frozen=True)
class Violation:
    display: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.display}:{self.line}: {self.text}"


def layer_violations(
    graph: ImportGraph, layers: Sequence[tuple[str, Sequence[str]]], top: str
) -> tuple[list[Violation], list[str]]:
    """(imports from a higher layer, modules in no layer)."""
    unassigned = sorted(m for m in graph.modules if layer_of(m, layers, top) is None)
    out = []
    for edge in graph.edges:
        a, b = layer_of(edge.source, layers, top), layer_of(edge.target, layers, top)
        if a is not None and b is not None and b > a:
            out.append(Violation(
                edge.display, edge.line,
                f"{edge.text}  ({layers[a][0]} imports {layers[b][0]}: {edge.target}"
                + (", function-local" if edge.local else "")
                + (", TYPE_CHECKING" if edge.type_only else "") + ")",
            ))  # fmt: skip
    return sorted(set(out), key=lambda v: (v.display, v.line, v.text)), unassigned


# -- private names ---------------------------------------------------------------------------

_ATTRIBUTE_FUNCTIONS = ("getattr", "setattr", "hasattr", "delattr")


def _is_self_like(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)``, ``self.__class__``."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "super":
            return True
        return node.func.id == "type" and len(node.args) == 1 and _is_self_like(node.args[0])
    return (
        isinstance(node, ast.Attribute) and node.attr == "__class__" and _is_self_like(node.value)
    )


def _names_bound(target: ast.expr) -> Iterable[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _names_bound(element)
    elif isinstance(target, ast.Starred):
        yield from _names_bound(target.value)


def defined_names(tree: ast.Module) -> set[str]:
    """Names the module itself defines: module-level functions, classes and assignments;
    in every class, methods, class attributes, annotated fields and ``__slots__``; and
    attributes assigned on ``self``/``cls`` (``self._x = ...``, ``setattr(self, "_x", ...)``,
    ``object.__setattr__(self, "_x", ...)``). Imports are not definitions."""
    names: set[str] = set()

    def scope(body: Sequence[ast.stmt], in_class: bool) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    names.update(_names_bound(target))
                    if in_class and isinstance(target, ast.Name) and target.id == "__slots__":
                        names.update(
                            s for e in getattr(stmt.value, "elts", ()) if (s := _str_constant(e))
                        )
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
                names.update(_names_bound(stmt.target))
            elif isinstance(stmt, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody"):
                    scope(getattr(stmt, block, []), in_class)
                for handler in getattr(stmt, "handlers", []):
                    scope(handler.body, in_class)

    scope(tree.body, in_class=False)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            scope(node.body, in_class=True)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            func = node.func
            is_setattr = (isinstance(func, ast.Name) and func.id == "setattr") or (
                isinstance(func, ast.Attribute) and func.attr == "__setattr__"
            )
            if is_setattr and _is_self_like(node.args[0]) and (s := _str_constant(node.args[1])):
                names.add(s)
    return names


def private_access_violations(
    module: Module,
    modules: Mapping[str, Module],
    shared_private_modules: Iterable[str] = (),
) -> list[Violation]:
    """Private names of other modules used by ``module`` (rules: test_architecture.py)."""
    shared = set(shared_private_modules)
    top = module.name.partition(".")[0]
    lines = module.path.read_text(encoding="utf-8").splitlines()
    own = defined_names(module.tree)
    aliases: dict[str, str] = {}  # local name -> module (package or external) it is bound to
    out: list[Violation] = []

    def text(node: ast.AST) -> str:
        return _segment(lines, node)

    def foreign(owner: str, name: str) -> str | None:
        """Why ``owner``'s private ``name`` is off limits here (None: it is not)."""
        if owner in shared:
            return None
        if f"{owner}.{name}" in modules:
            if f"{owner}.{name}" in shared or modules[f"{owner}.{name}"].folder == module.folder:
                return None
            return f"private module of {modules[owner].folder.name}/"
        if owner in modules:
            if modules[owner].folder == module.folder:
                return None
            return f"private name of {owner}"
        return f"private name of {owner} (outside the package)"

    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
        elif isinstance(node, ast.ImportFrom):
            parts = module.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            base = ".".join(p for p in (base, node.module or "") if p)
            external = base != top and not base.startswith(top + ".")
            for alias in node.names:
                # a module of the package, or any name from outside it (module or not)
                if external or f"{base}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
                if is_private(alias.name) and (why := foreign(base, alias.name)):
                    out.append(Violation(module.display, node.lineno, f"{text(node)}  ({why})"))

    for node in ast.walk(module.tree):
        receiver: ast.expr | None = None
        name: str | None = None
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            receiver, name = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _ATTRIBUTE_FUNCTIONS
            and len(node.args) >= 2
            and (literal := _str_constant(node.args[1])) is not None
            and is_private(literal)
        ):
            receiver, name = node.args[0], literal
        if receiver is None or name is None or _is_self_like(receiver):
            continue
        if isinstance(receiver, ast.Name) and receiver.id in aliases:
            owner = aliases[receiver.id]  # a module bound by an import: its folder decides
            if owner in modules or (owner != top and not owner.startswith(top + ".")):
                if (why := foreign(owner, name)) is None:
                    continue
                out.append(Violation(module.display, node.lineno, f"{text(node)}  ({why})"))
                continue
        if name in own:
            continue
        out.append(Violation(module.display, node.lineno, text(node)))
    return sorted(set(out), key=lambda v: (v.line, v.text))
