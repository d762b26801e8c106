"""The Figure 2 reproduction script in its quick mode (slow: about 10-20 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "reproductions" / "normalisation_figure2.py"


@pytest.mark.slow
def test_figure2_quick(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "figures"  # --out is a folder: the picture is out/normalisation_figure2.png
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    png = out / "normalisation_figure2.png"
    assert png.exists() and png.stat().st_size > 10_000
    payload = json.loads(result.stdout)
    assert payload["plot"] == str(png)
    assert payload["settings"]["model_decreasing_in_n"] is True
    ratios = [r["audited_over_sgm"] for r in payload["rows"]]
    assert ratios and max(ratios) > 100  # EASGM at tiny N: far above SGM
