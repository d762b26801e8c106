"""Shared by the reproduction scripts (run as ``python reproductions/NAME.py``)."""

from __future__ import annotations

import importlib.util


def plotting_available(no_plot: bool) -> bool:
    """False (with a note) under ``--no-plot`` or without matplotlib: the table is the result."""
    if no_plot:
        return False
    if importlib.util.find_spec("matplotlib") is None:
        print("note: matplotlib is not installed; table printed, plot skipped "
              "(pip install matplotlib, or pass --no-plot).")
        return False
    return True
