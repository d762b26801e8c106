"""Lazy package attributes (PEP 562): the ``__getattr__`` and ``__dir__`` of a package whose
public names live in submodules that are imported only when a name is first used."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Collection, Mapping
from typing import Any

from opacus_lastiterate._warn import warn


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


def moved_attributes(
    old: str, new: str, namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of a deprecated module ``old`` whose names moved to ``new``.

    Any name of ``new`` (dunder names excepted) is still found at the old path, with a
    ``DeprecationWarning`` that names the new one; ``new`` is imported on first access only,
    so the old module stays as light to import as before. The old paths go in the next
    release.

    Args:
        old: the deprecated module's ``__name__``.
        new: the absolute name of the module the names moved to.
        namespace: the deprecated module's ``globals()`` (nothing is cached there, so every
            access warns).
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module = importlib.import_module(new)
        if not hasattr(module, name):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warn(
            f"{old} moved to {new}: import {name} from {new} (the old path is deprecated and "
            "goes in the next release).",
            DeprecationWarning,
        )
        return getattr(module, name)

    def __dir__() -> list[str]:  # the moved names are not listed: listing warns nobody
        return sorted(namespace)

    return __getattr__, __dir__


def moved_name(old: str, name: str, new: str) -> Any:
    """``name`` of module ``new``, asked for at its former home ``old`` (a module's
    ``__getattr__``): the object, with a ``DeprecationWarning`` naming the new path."""
    warn(
        f"{old}.{name} moved to {new}.{name}; the old path is deprecated and goes in the next "
        "release.",
        DeprecationWarning,
    )
    return getattr(importlib.import_module(new), name)
