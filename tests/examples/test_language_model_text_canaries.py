"""examples/language_model_text_canaries.py runs (plain loop and Trainer) and prints the audit
of its text canaries beside the reference epsilons; the committed output has that shape."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "language_model_text_canaries.py"
OUTPUT = REPO / "docs" / "results" / "language_model_text_canaries.txt"


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--trainer", "--rank", "4"]])
def test_quick_mode_prints_the_text_canary_audit(tmp_path: Path, extra: list[str]) -> None:
    pytest.importorskip("transformers")
    if extra:
        pytest.importorskip("peft")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", *extra],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "text canaries: 100 (" in out and "included by fair coins)" in out
    assert "one-run       epsilon >=" in out and "standard composition" in out


def test_committed_output_reports_both_runs() -> None:
    text = OUTPUT.read_text()
    assert "== sigma = 0.3:" in text and "== sigma = 1:" in text
    assert text.count("text canaries: 200 (") == 2
