"""What every reproduced figure returns: labelled rows, a text table and a JSON form."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opacus_lastiterate._json import json_safe

__all__ = ["Column", "FigureResult"]


@dataclass(frozen=True)
class Column:
    """A column of the text table: the row key, its header and a format spec."""

    key: str
    header: str
    fmt: str = ""

    def format(self, value: Any) -> str:
        if isinstance(value, float) and not math.isfinite(value):
            return "inf" if value > 0 else ("-inf" if value < 0 else "nan")
        if value is None:
            return "-"
        return format(value, self.fmt)


@dataclass
class FigureResult:
    """The numbers behind one reproduced figure or table.

    Attributes:
        name: the figure's name on the command line (``reproduce NAME``).
        title: one line naming the paper and the figure.
        settings: the configuration that produced the numbers (JSON data).
        columns: the columns of the text table, in order.
        rows: one dict per row; every number a column shows is in it.
        labels: row key -> what that number is (exact, heuristic, bound, estimate...).
        notes: lines printed under the table.
        plot: ``plot(result, path)`` draws the figure (matplotlib, imported lazily).
        group: the row key that splits the table into panels (None: one table).
    """

    name: str
    title: str
    settings: dict[str, Any]
    columns: Sequence[Column]
    rows: list[dict[str, Any]]
    labels: dict[str, str]
    notes: Sequence[str] = ()
    plot: Callable[[FigureResult, Path], None] | None = field(default=None, repr=False)
    group: str | None = None

    def table(self) -> str:
        """The rows as an aligned text table (one block per panel), then the notes."""
        cells = [[c.format(r.get(c.key)) for c in self.columns] for r in self.rows]
        widths = [
            max([len(c.header)] + [len(row[i]) for row in cells])
            for i, c in enumerate(self.columns)
        ]
        header = "  ".join(c.header.rjust(w) for c, w in zip(self.columns, widths))
        lines = [self.title]
        previous: object = object()
        for row, text in zip(self.rows, cells):
            if self.group is not None and row.get(self.group) != previous:
                previous = row.get(self.group)
                lines += ["", str(previous), header]
            elif self.group is None and len(lines) == 1:
                lines.append(header)
            lines.append("  ".join(t.rjust(w) for t, w in zip(text, widths)))
        lines.append("")
        for key, label in self.labels.items():
            lines.append(f"  {key}: {label}")
        lines.extend(self.notes)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Strict-JSON form: name, title, settings, labels, notes and rows."""
        return json_safe(
            {
                "figure": self.name,
                "title": self.title,
                "settings": self.settings,
                "labels": self.labels,
                "notes": list(self.notes),
                "rows": self.rows,
            }
        )
