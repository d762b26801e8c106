"""What ``opacus-lastiterate`` prints is consistent: the robust heuristic is never printed
below the heuristic (it is a maximum over t <= T that includes t = T), and ``--plot`` draws
every value the table prints, the weighted heuristic included."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

import opacus_lastiterate.analysis.comparison as comparison
from opacus_lastiterate.analysis.last_iterate import heuristic as heuristic_module
from opacus_lastiterate.cli import main

CONFIG = ["--steps", "40", "--sample-rate", "0.05", "--noise-multiplier", "1.1",
          "--value-discretization-interval", "1e-2"]
LOW = 1 - 3e-5  # a robust value a few units of the 4th decimal below the heuristic


@pytest.fixture
def robust_low(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every robust value the analysis hands the CLI comes out just below the heuristic,
    as two separately rounded upper bounds could."""
    original = comparison.compare_epsilons

    def low(*args, **kwargs):  # type: ignore[no-untyped-def]
        result = original(*args, **kwargs)
        return replace(result, robust_heuristic=result.heuristic * LOW)

    monkeypatch.setattr(comparison, "compare_epsilons", low)
    original_model = heuristic_module.RobustLastIterateHeuristic.delta

    def low_delta(self, epsilon):  # type: ignore[no-untyped-def]
        plain = heuristic_module.LastIterateHeuristic(self.run).delta(epsilon)
        return min(original_model(self, epsilon), plain * LOW)

    monkeypatch.setattr(heuristic_module.RobustLastIterateHeuristic, "delta", low_delta)


def _rows(text: str, unit: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(
        rf"^\s+(\w+)\s+{unit} =\s+(\S+)", text, re.MULTILINE)}


def test_robust_is_never_printed_below_the_heuristic(robust_low, capsys) -> None:  # type: ignore[no-untyped-def]
    for quantity, unit in ((["--delta", "1e-5"], "eps"), (["--epsilon", "1.5"], "delta")):
        assert main(["epsilon", *CONFIG, *quantity, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["robust_heuristic"] >= out["heuristic"] > 0, quantity
        assert main(["epsilon", *CONFIG, *quantity]) == 0
        rows = _rows(capsys.readouterr().out, unit)
        assert rows["robust_heuristic"] >= rows["heuristic"] > 0, (quantity, rows)


def test_robust_is_never_printed_below_the_heuristic_when_calibrating(robust_low, capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["epsilon", "--steps", "40", "--sample-rate", "0.05", "--delta", "1e-5",
            "--target-epsilon", "2", "--calibrate", "heuristic"]
    assert main([*argv, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["calibrations"]
    assert row["robust_heuristic"] >= row["heuristic"]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    header = table[1].split()
    values = dict(zip(header[-5:], table[2].split()[-5:], strict=True))
    assert float(values["robust"]) >= float(values["heuristic"])


def test_the_plot_shows_every_value_the_table_prints(monkeypatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The picture's points at t = T are the table's numbers, the weighted heuristic of
    --momentum / --lr-schedule included (read from the saved figure's lines)."""
    figure_module = pytest.importorskip("matplotlib.figure")
    drawn = []
    original = figure_module.Figure.savefig

    def keep(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(figure_module.Figure, "savefig", keep)
    argv = ["epsilon", *CONFIG, "--delta", "1e-5", "--lr-schedule", "cosine", "--momentum",
            "0.5", "--plot", str(tmp_path / "eps.png"), "--json"]
    assert main(argv) == 0
    table = json.loads(capsys.readouterr().out)
    (figure,) = drawn
    at_t = {line.get_label(): float(y) for ax in figure.axes for line in ax.get_lines()
            for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True) if x == 40}
    for key in ("heuristic", "robust_heuristic", "standard", "full_batch", "weighted_heuristic"):
        assert any(math.isclose(y, table[key], rel_tol=1e-12) for y in at_t.values()), (key, at_t)
    (weighted_label,) = [label for label in at_t if "weighted" in label]
    assert math.isclose(at_t[weighted_label], table["weighted_heuristic"], rel_tol=1e-12)
    assert table["weighted_heuristic"] != pytest.approx(table["heuristic"], rel=1e-3)
