"""The Figure 2 reproduction script in its quick mode (slow: about 20 s)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "reproductions" / "normalisation_figure2.py"


@pytest.mark.slow
def test_figure2_quick(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "figure2.png"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.exists() and out.stat().st_size > 10_000
    assert "model delta(0) decreasing in N: True" in result.stdout
    ratios = [float(x) for x in re.findall(r"\|\s+([0-9.]+)\s*$", result.stdout, re.MULTILINE)]
    assert ratios and max(ratios) > 100  # EASGM at tiny N: far above SGM
