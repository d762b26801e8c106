"""The papers' figures and tables, recomputed: numbers first, pictures with matplotlib.

Each module computes one figure or table from the package's analysis, simulation and audit
functions and returns a :class:`FigureResult` (labelled rows, a text table, a JSON form and
a ``plot`` that draws it; matplotlib is imported only when drawing, the ``plot`` extra).
``opacus-lastiterate reproduce NAME`` runs them (``docs/cli.md``); every ``compute`` takes a
size: ``"quick"`` (seconds, for tests), ``"default"`` (up to about a minute) or ``"full"`` (the
papers' settings where they are known).

Importing this package is cheap: a figure module is loaded by :func:`load`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from opacus_lastiterate.figures._base import Column, FigureResult

__all__ = [
    "Column",
    "FigureResult",
    "load",
]

FIGURES: dict[str, tuple[str, str]] = {
    "last-iterate-fig1": (
        "last_iterate_fig1",
        "heuristic, standard and full-batch epsilon against T in three regimes",
    ),
    "last-iterate-fig3": (
        "last_iterate_fig3",
        "audit of the Dirac gradient canary with an adversarial data set (simulated)",
    ),
    "last-iterate-fig5": (
        "last_iterate_fig5",
        "quadratic-regulariser counterexample / robust heuristic against T",
    ),
    "last-iterate-table1": (
        "last_iterate_table1",
        "batch sizes 4096, 512, 256 at about equal heuristic epsilon (CIFAR-10 sizes)",
    ),
    "cebere-fig4": (
        "cebere_fig4",
        "hidden-state audit, canary at step 1 only: eps_25 / eps_1 against B (simulated)",
    ),
    "normalisation-fig2": (
        "normalisation_fig2",
        "audited delta(0) of ASGM and EASGM against N, d = 100 (simulated)",
    ),
}
"""Name on the command line -> (module, one-line description)."""

SIZES: tuple[str, ...] = ("quick", "default", "full")


def load(name: str) -> ModuleType:
    """The module of figure ``name`` (a key of :data:`FIGURES`)."""
    if name not in FIGURES:
        raise ValueError(f"`name` must be one of {', '.join(FIGURES)}, got {name!r}.")
    return importlib.import_module(f"{__name__}.{FIGURES[name][0]}")
