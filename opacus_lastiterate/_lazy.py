"""Lazy package attributes (PEP 562): the ``__getattr__`` and ``__dir__`` of a package whose
public names live in submodules that are imported only when a name is first used."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_attributes(
    package: str,
    names: Mapping[str, str],
    namespace: dict[str, Any],
    submodules: Collection[str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``.

    Args:
        package: the package's ``__name__``.
        names: public name -> the module defining it, relative to ``package`` (``"runner"``)
            or absolute (``"opacus_lastiterate.analysis"``).
        namespace: the package's ``globals()``; a resolved name is stored there, so later
            accesses skip ``__getattr__``.
        submodules: the submodules reachable as attributes; None: any that exists.
    """
    prefix = package + "."

    def __getattr__(name: str) -> Any:
        if name in names:
            module = names[name]
            if not module.startswith(prefix) and module != package:
                module = prefix + module
            value = getattr(importlib.import_module(module), name)
            namespace[name] = value
            return value
        if submodules is not None:
            if name in submodules:
                return importlib.import_module(prefix + name)
        elif not name.startswith("_") and importlib.util.find_spec(prefix + name) is not None:
            return importlib.import_module(prefix + name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())) | set(submodules or ()))

    return __getattr__, __dir__

