"""Make ``PrivacyEngine(accountant="last_iterate")`` work on every Opacus 1.x.

Importing :mod:`opacus_lastiterate.accountants` registers this package's accountants:

* **Opacus >= 1.6** has an accountant registry (``opacus.accountants.registry``, Opacus PR
  #784). We register through it with ``force=True``, so importing twice is harmless.
* **Opacus 1.0-1.5** has no registry. ``create_accountant`` is a function defined in
  ``opacus/accountants/__init__.py`` and imported *by name* into ``opacus.privacy_engine`` and
  ``opacus.accountants.utils`` (which ``make_private_with_epsilon`` uses). We install a small
  compatibility shim: a wrapper around the original ``create_accountant`` that returns an
  instance of an accountant registered here and hands every other name to the original. The
  wrapper is assigned in those three module namespaces, once (it is marked, and re-installing
  it reuses it). Code that did ``from opacus.accountants import create_accountant`` before
  this package was imported keeps the original function.

Alternative without any registration (all Opacus 1.x)::

    engine = PrivacyEngine()
    engine.accountant = LastIterateAccountant()   # before make_private attaches its hook
    model, optimizer, loader = engine.make_private(...)

``make_private_with_epsilon`` however creates a fresh accountant by name
(``get_noise_multiplier(accountant=engine.accountant.mechanism())``), so it needs the
registry or the shim.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import cast

import opacus
from opacus.accountants import IAccountant

try:  # Opacus >= 1.6
    from opacus.accountants.registry import register_accountant as _opacus_register_accountant
except ImportError:  # Opacus 1.0-1.5
    _opacus_register_accountant = None

__all__ = [
    "register_accountant",
]

HAS_NATIVE_REGISTRY: bool = _opacus_register_accountant is not None
"""True if the installed Opacus has ``opacus.accountants.registry`` (Opacus >= 1.6)."""

OPACUS_BUILTIN_MECHANISMS = frozenset({"rdp", "gdp", "prv"})

_SHIM_MARK = "__opacus_lastiterate_shim__"

# Accountants registered through this module, by mechanism name (read by the shim).
_PLUGIN_ACCOUNTANTS: dict[str, type[IAccountant]] = {}


def _check_accountant_class(mechanism: object, accountant_cls: object) -> None:
    if not isinstance(mechanism, str) or not mechanism:
        raise TypeError(f"`mechanism` must be a non-empty string, got {mechanism!r}.")
    if mechanism in OPACUS_BUILTIN_MECHANISMS:
        raise ValueError(
            f"`mechanism` must not be one of Opacus's own accountants "
            f"{sorted(OPACUS_BUILTIN_MECHANISMS)}, got {mechanism!r}."
        )
    if not (isinstance(accountant_cls, type) and issubclass(accountant_cls, IAccountant)):
        raise TypeError(
            f"`accountant_cls` must be a subclass of opacus.accountants.IAccountant, "
            f"got {accountant_cls!r}."
        )
    if inspect.isabstract(accountant_cls):
        raise TypeError(
            f"`accountant_cls` must be a concrete class, got abstract {accountant_cls!r}."
        )
    required = [
        p.name
        for p in inspect.signature(accountant_cls).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"`accountant_cls` must be constructible with no arguments (Opacus calls cls()), "
            f"but {accountant_cls.__name__} requires {required}."
        )
    name = cast("type[IAccountant]", accountant_cls).mechanism()
    if name != mechanism:
        raise ValueError(
            f"`mechanism` must equal {accountant_cls.__name__}.mechanism() = {name!r} "
            f"(make_private_with_epsilon looks accountants up by that name), got {mechanism!r}."
        )


def register_accountant(mechanism: str, accountant_cls: type[IAccountant]) -> None:
    """Make ``PrivacyEngine(accountant=mechanism)`` create ``accountant_cls()``, on any Opacus 1.x.

    Idempotent: registering again replaces the class. Uses Opacus's registry when it exists
    (>= 1.6) and the documented compatibility shim otherwise (see the module docstring).

    Args:
        mechanism: the name, equal to ``accountant_cls.mechanism()``; not an Opacus built-in.
        accountant_cls: a concrete ``IAccountant`` subclass constructible with no arguments.

    Raises:
        TypeError, ValueError: on an invalid name or class; nothing is registered then.
    """
    _check_accountant_class(mechanism, accountant_cls)
    _PLUGIN_ACCOUNTANTS[mechanism] = accountant_cls
    if _opacus_register_accountant is not None:
        _opacus_register_accountant(mechanism, accountant_cls, force=True)
    else:
        _install_compat_shim()


def registered_accountants() -> dict[str, type[IAccountant]]:
    """The accountants registered through :func:`register_accountant`, by mechanism name."""
    return dict(_PLUGIN_ACCOUNTANTS)


def _make_shim(original: Callable[..., IAccountant]) -> Callable[..., IAccountant]:
    @functools.wraps(original)
    def create_accountant(mechanism: str) -> IAccountant:
        cls = _PLUGIN_ACCOUNTANTS.get(mechanism) if isinstance(mechanism, str) else None
        if cls is not None:
            return cls()
        return original(mechanism=mechanism)

    create_accountant.__doc__ = (
        "Opacus's create_accountant, extended by opacus_lastiterate with the accountants "
        "registered through opacus_lastiterate.accountants.register_accountant "
        f"(Opacus {opacus.__version__} has no accountant registry)."
    )
    setattr(create_accountant, _SHIM_MARK, True)
    return create_accountant


def _install_compat_shim() -> None:
    """Opacus 1.0-1.5: route ``create_accountant`` through the registered accountants."""
    import opacus.accountants as accountants_pkg
    import opacus.accountants.utils as accountants_utils
    from opacus import privacy_engine

    current = accountants_pkg.create_accountant
    shim = current if getattr(current, _SHIM_MARK, False) else _make_shim(current)
    for module in (accountants_pkg, privacy_engine, accountants_utils):
        module.create_accountant = shim  # type: ignore[attr-defined]


