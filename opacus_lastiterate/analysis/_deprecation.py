"""Deprecation paths of renamed public names: each old spelling keeps working for one release
with a :class:`DeprecationWarning` that names its replacement (attributed to the caller's line,
:func:`opacus_lastiterate._warn.warn`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from opacus_lastiterate._warn import warn

__all__ = ["deprecated", "moved_names", "renamed_keyword"]

_SENTINEL: Any = object()


def deprecated(old: str, new: str) -> None:
    """Warn that ``old`` is deprecated in favour of ``new``."""
    warn(f"{old} is deprecated and will be removed in the next release; use {new}.",
         DeprecationWarning)


def renamed_keyword(
    function: str, old: str, old_value: Any, new: str, new_value: Any, default: Any
) -> Any:
    """The value of keyword ``new`` when the deprecated keyword ``old`` may have been passed
    instead (``old_value`` is :data:`MISSING` when it was not): passing both is a TypeError."""
    if old_value is MISSING:
        return new_value
    if new_value != default:
        raise TypeError(f"{function}() got both `{old}` (deprecated) and `{new}`; pass `{new}`.")
    deprecated(f"{function}(..., {old}=...)", f"`{new}=`")
    return old_value


MISSING: Any = _SENTINEL
"""Default of a deprecated keyword: it was not passed."""


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``moved`` names (old name -> ``"new.module:name"``)
    with a DeprecationWarning naming the new path."""

    def __getattr__(name: str) -> Any:
        if name in moved:
            target_module, _, target = moved[name].partition(":")
            deprecated(f"`{module}.{name}`", f"`{target_module}.{target}`")
            return getattr(importlib.import_module(target_module), target)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
