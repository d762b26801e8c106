"""The error of a part of the package that needs torch or Opacus, imported where they are
not installed.

The light distribution, ``opacus-lastiterate-light``, installs this whole package without
torch and Opacus (``docs/architecture.md``, "Two distributions"): the mathematics
(:mod:`opacus_lastiterate.analysis`, with the audit statistics and the dp_accounting
accountant) and the command's math commands work there; the Opacus accountants, the monitor,
the samplers, the schedules read from torch optimisers and the training audits do not.
Importing one of those raises :class:`ModuleNotFoundError` (so ``except ImportError`` still
catches it) whose message names the part, the missing module and the full distribution.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FULL_DISTRIBUTION", "LIGHT_DISTRIBUTION", "missing_message", "require", "requires"]

FULL_DISTRIBUTION = "opacus-lastiterate"
LIGHT_DISTRIBUTION = "opacus-lastiterate-light"


def missing_message(part: str, needs: tuple[str, ...]) -> str:
    """The message of the error: ``part`` needs ``needs``, and those of them that cannot be
    found are not installed."""
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    return (
        f"{part} needs {' and '.join(needs)}; not installed: {', '.join(missing)}. Without torch "
        f"and Opacus (the light distribution, {LIGHT_DISTRIBUTION}) the package has the "
        "accounting and the audit statistics only: opacus_lastiterate.analysis (with "
        "LastIterateHeuristicAccountant for dp_accounting) and the math commands of the "
        f"opacus-lastiterate command. For the Opacus integration install the full "
        f"distribution, {FULL_DISTRIBUTION} (README, 'Install with pip'; uninstall "
        f"{LIGHT_DISTRIBUTION} first, the two hold the same files)."
    )


def require(part: str, *needs: str) -> None:
    """Raise :class:`ModuleNotFoundError` naming ``part`` if a top-level module of ``needs``
    cannot be found; import nothing."""
    for name in needs:
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(missing_message(part, needs), name=name)


@contextmanager
def requires(part: str, *needs: str) -> Iterator[None]:
    """Imports inside the block that fail because a module of ``needs`` (or one of its
    submodules) is not installed raise the message of :func:`missing_message` instead,
    chained to the original error; other errors pass unchanged."""
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if missing not in needs or importlib.util.find_spec(missing) is not None:
            raise
        raise ModuleNotFoundError(missing_message(part, needs), name=missing) from error
