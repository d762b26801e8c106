"""Every figure says what it shows (issue 26): a title, labelled axes, a legend that covers no
data, colours from the colour-blind-safe palette with a marker per series, and on an audit
figure computed with ``--quick`` the words "quick mode: too few runs for a useful bound".

The figures are drawn from their quick computations; ``save`` is replaced by a function that
keeps the figure, so the checks read matplotlib's own objects (what would be written).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from matplotlib.colors import to_hex

from opacus_lastiterate.figures import FIGURES, load
from opacus_lastiterate.figures._plotting import OKABE_ITO, QUICK_NOTE

AUDIT_FIGURES = {"last-iterate-fig3", "cebere-fig4", "normalisation-fig2"}
PALETTE = {c.lower() for c in OKABE_ITO}


def _drawn(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    import opacus_lastiterate.figures._plotting as plotting

    kept: list[Any] = []

    def keep(fig: Any, path: Path) -> None:
        fig.canvas.draw()  # lays out the legends, as saving would
        kept.append(fig)

    monkeypatch.setattr(plotting, "save", keep)
    module = load(name)
    monkeypatch.setattr(module, "save", keep, raising=False)
    result = module.compute("quick")
    result.plot(result, Path("unused.png"))
    assert len(kept) == 1
    return kept[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_says_what_it_shows(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fig = _drawn(name, monkeypatch)
    texts = [t.get_text() for t in fig.texts]
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    for ax in fig.axes:
        assert ax.get_title() or suptitle, f"{name}: an axes without a title"
        assert ax.get_xlabel().strip() and ax.get_ylabel().strip(), f"{name}: unlabelled axis"
        for line in ax.get_lines():
            if line.get_label().startswith("_") or len(line.get_xdata()) == 0:
                continue
            colour = to_hex(line.get_color()).lower()
            grey = len(set(colour[1:][i:i + 2] for i in (0, 2, 4))) == 1
            assert colour in PALETTE or grey, f"{name}: colour {colour} outside the palette"
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            covers = box.overlaps(ax.get_window_extent(renderer)) and _covers_data(ax, box)
            assert not covers, f"{name}: a legend covers data of an axes"
    if name in AUDIT_FIGURES:
        assert QUICK_NOTE in texts, f"{name}: quick mode not said on the figure"
    else:
        assert QUICK_NOTE not in texts


def _covers_data(ax: Any, box: Any) -> bool:
    """Whether a data point of ``ax`` falls inside the window box ``box``."""
    import numpy as np

    for line in ax.get_lines():
        xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
        xy = xy[np.isfinite(xy).all(axis=1)]
        if xy.size and any(box.contains(*p) for p in ax.transData.transform(xy)):
            return True
    return False


def test_the_quick_note_is_drawn_only_in_quick_mode() -> None:
    from opacus_lastiterate.figures._plotting import pyplot, quick_note

    fig = pyplot().figure()
    quick_note(fig, {"size": "default"})
    assert not fig.texts
    quick_note(fig, {"size": "quick"})
    assert [t.get_text() for t in fig.texts] == [QUICK_NOTE]
    pyplot().close(fig)


def test_series_styles_differ_by_colour_and_marker() -> None:
    from opacus_lastiterate.figures._plotting import series_style

    styles = [series_style(i) for i in range(8)]
    assert len({s["color"] for s in styles}) == 8 and len({s["marker"] for s in styles}) == 8
    assert {s["color"].lower() for s in styles} <= PALETTE
