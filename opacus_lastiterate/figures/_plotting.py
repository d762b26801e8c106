"""matplotlib, imported only when a figure is drawn (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["IMAGE_SUFFIXES", "panel_axes", "pyplot", "save"]

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
"""File types a plot can be saved as (matplotlib picks the format from the suffix)."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "Drawing a plot needs matplotlib: pip install 'opacus-lastiterate[plot]' "
            "(or leave the plot out)."
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel_axes(
    rows: list[dict[str, Any]], width: float, height: float
) -> tuple[Any, list[tuple[Any, str, list[dict[str, Any]]]]]:
    """A figure with one panel per distinct ``row["panel"]`` (in order of appearance), and
    per panel (axes, name, its rows); ``width`` is the width of one panel."""
    panels = list(dict.fromkeys(r["panel"] for r in rows))
    fig, axes = pyplot().subplots(
        1, len(panels), figsize=(width * len(panels), height), squeeze=False
    )
    return fig, [
        (ax, panel, [r for r in rows if r["panel"] == panel])
        for ax, panel in zip(axes[0], panels, strict=True)
    ]


def save(fig: Any, path: Path) -> None:
    """Save ``fig`` to ``path`` (creating its folder) and close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
