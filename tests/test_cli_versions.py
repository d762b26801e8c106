"""``opacus-lastiterate compare-versions``."""

from __future__ import annotations

import json

import pytest

from opacus_lastiterate.cli import main

ARGS = ["compare-versions", "--dataset-size", "147", "--batch-size", "3",
        "--noise-multiplier", "1", "--delta", "1e-5", "--epochs", "1"]


def test_text_output_one_row_per_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--versions", "0.14.0..1.0.1"]) == 0
    out = capsys.readouterr().out
    for v in ("0.14.0", "0.15.0", "1.0.0", "1.0.1"):
        assert f"\n{v} " in out
    assert "1.1.0" not in out and "int(N * q) = 2" in out and "inf" in out


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--json", "--versions", "1.3.0,0.9.0"]) == 0
    payload = json.loads(capsys.readouterr().out)
    rows = {r["version"]: r for r in payload["rows"]}
    assert set(rows) == {"1.3.0", "0.9.0"}
    assert rows["1.3.0"]["corrected"] == "inf" and rows["1.3.0"]["accountant"] == "prv"
    assert rows["0.9.0"]["mechanism"] == "ASGM, shuffled"


def test_bad_range_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([*ARGS, "--versions", "1.6.0..1.0.0"])
    assert "empty version range" in capsys.readouterr().err


def test_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    path = tmp_path / "v.png"
    assert main([*ARGS, "--versions", "1.0.0..1.6.0", "--plot", str(path)]) == 0
    assert path.stat().st_size > 0
