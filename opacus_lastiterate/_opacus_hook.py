"""Register this package's accountants with Opacus when (and only when) Opacus is imported.

:func:`install` registers a post-import hook for ``opacus`` with
``wrapt.register_post_import_hook``: when ``opacus`` finishes importing, the hook imports
:mod:`opacus_lastiterate.accountants`, whose modules register ``"last_iterate"``, ``"asgm"``
and ``"feasgm"`` (Opacus's registry on 1.6, the compatibility shim on 1.0-1.5). If ``opacus``
is already imported, wrapt calls the hook at once. So ``import opacus_lastiterate`` costs no
torch import, and ``PrivacyEngine(accountant="last_iterate")`` works whichever of the two
packages is imported first.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["ACCOUNTANTS_MODULE", "install", "register_with_opacus"]

ACCOUNTANTS_MODULE = "opacus_lastiterate.accountants"

_installed = False


def register_with_opacus(module: ModuleType | None = None) -> None:
    """Post-import hook of ``opacus``: import :mod:`opacus_lastiterate.accountants`.

    Importing that package registers the accountants. If it is already in ``sys.modules``
    it has registered them, or is importing (Opacus was imported by one of its own modules)
    and registers them when its module code finishes; importing it again here would meet a
    partially initialised module.
    """
    del module  # the hook is called with the opacus module; registration needs no argument
    if ACCOUNTANTS_MODULE not in sys.modules:
        importlib.import_module(ACCOUNTANTS_MODULE)


def install() -> None:
    """Register :func:`register_with_opacus` to run when ``opacus`` is imported (now if it
    already is). Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    import wrapt

    # wrapt calls the hook at once when opacus is already in sys.modules.
    wrapt.register_post_import_hook(register_with_opacus, "opacus")
