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


MNIST = ["compare-versions", "--dataset-size", "60000", "--batch-size", "256",
         "--noise-multiplier", "1.1", "--delta", "1e-5", "--epochs", "1"]


def _text_and_rows(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[str, list[dict]]:
    assert main([*MNIST, *extra, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert main([*MNIST, *extra]) == 0
    return capsys.readouterr().out, rows


def test_each_note_is_printed_once_with_its_releases(capsys: pytest.CaptureFixture[str]) -> None:
    text, rows = _text_and_rows(capsys, "--versions", "0.9.0..0.15.0")
    notes = {w for r in rows for w in r["warnings"]}
    # the same notes repeat over 0.9.0-0.11.0 and over 0.14.0-0.15.0 in the rows (JSON)
    assert len(notes) >= 3 and sum(len(r["warnings"]) for r in rows) > len(notes)
    lines = text.splitlines()
    for note in notes:
        assert text.count(note) == 1, note
    numbered = {}
    for line in lines[lines.index("notes (the releases each applies to):") + 1:]:
        if not line.startswith("  ") or line.startswith("  -"):
            break
        number, rest = line.strip().split(". ", 1)
        releases, note = rest.split(": ", 1)
        numbered[note] = (int(number), releases)
    assert set(numbered) == notes
    shuffled = [n for n in notes if n.startswith("fixed-size shuffled batches")]
    assert len(shuffled) == 1 and numbered[shuffled[0]][1] == "0.9.0-0.11.0"
    for r in rows:  # the notes column of each row: the numbers of exactly its notes
        row_line = next(line for line in lines if line.startswith(f"{r['version']} "))
        expected = ",".join(str(numbered[w][0]) for w in r["warnings"])
        if expected:
            assert row_line.endswith(f" {expected}"), row_line
        else:
            assert row_line.endswith(" 0.2145") or row_line.endswith(" 0.2149"), row_line


def test_a_range_of_releases_never_covers_one_not_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 0.9.1 is left out: 0.9.0 stands alone, 0.10.0, 0.10.1, 0.11.0 are consecutive releases
    text, _ = _text_and_rows(capsys, "--versions", "0.9.0,0.10.0,0.10.1,0.11.0")
    assert "0.9.0, 0.10.0-0.11.0: fixed-size shuffled batches" in text
    assert "0.9.0-0.11.0" not in text


def test_json_rows_keep_their_own_notes(capsys: pytest.CaptureFixture[str]) -> None:
    _, rows = _text_and_rows(capsys, "--versions", "0.9.0..0.10.0")
    assert [len(r["warnings"]) for r in rows] == [2, 2, 2]
    assert rows[0]["warnings"] == rows[1]["warnings"] == rows[2]["warnings"]
