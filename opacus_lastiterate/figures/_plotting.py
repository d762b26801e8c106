"""matplotlib, imported only when a figure is drawn (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "IMAGE_SUFFIXES",
    "MARKERS",
    "OKABE_ITO",
    "QUICK_NOTE",
    "legend_below",
    "panel_axes",
    "pyplot",
    "quick_note",
    "save",
    "series_style",
]

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
"""File types a plot can be saved as (matplotlib picks the format from the suffix)."""

OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7",
             "#F0E442")
"""Okabe and Ito's colour-blind-safe palette (black, orange, sky blue, bluish green,
vermillion, blue, reddish purple, yellow): every series of our figures takes one, with a
marker of its own, so that no two series differ by shade alone."""
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
QUICK_NOTE = "quick mode: too few runs for a useful bound"
"""Drawn on every audit figure computed with ``--quick``."""


def series_style(index: int) -> dict[str, Any]:
    """Colour and marker of the ``index``-th series (distinct for the first eight)."""
    return {"color": OKABE_ITO[index % len(OKABE_ITO)], "marker": MARKERS[index % len(MARKERS)]}


def legend_below(fig: Any, axes: Any, ncol: int | None = None, **kwargs: Any) -> Any:
    """One legend for the whole figure, below the axes, so that it covers no data: the
    labelled artists of ``axes`` (an axes or a list), each label once."""
    handles: dict[str, Any] = {}
    for ax in axes if isinstance(axes, (list, tuple)) else [axes]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if not handles:
        return None
    columns = ncol if ncol is not None else min(len(handles), 4)
    return fig.legend(list(handles.values()), list(handles), loc="upper center",
                      bbox_to_anchor=(0.5, 0.0), ncol=columns, frameon=False,
                      fontsize=kwargs.pop("fontsize", 9), **kwargs)


def quick_note(fig: Any, settings: dict[str, Any]) -> None:
    """:data:`QUICK_NOTE` above the figure (over no data) when ``settings["size"]`` is
    ``"quick"``."""
    if settings.get("size") != "quick":
        return
    fig.text(0.5, 1.0, QUICK_NOTE, ha="center", va="bottom", fontsize=12, color="#D55E00",
             fontweight="bold")


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
    """Save ``fig`` to ``path`` (creating its folder) and close it; the saved area grows to
    hold a legend placed outside the axes (:func:`legend_below`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
