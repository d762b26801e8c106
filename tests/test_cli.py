"""The command-line interface, run as a user would (``python -m opacus_lastiterate``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opacus_lastiterate.analysis.comparison import compare_epsilons
from opacus_lastiterate.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opacus_lastiterate", *args], capture_output=True, text=True
    )


ARGS = ["epsilon", "--steps", "3", "--sample-rate", "0.1", "--noise-multiplier", "1", "--delta", "1e-6"]


def test_json_output_has_the_four_epsilons():
    out = run_cli(*ARGS, "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    expected = compare_epsilons(1e-6, steps=3, sample_rate=0.1, noise_multiplier=1.0)
    for key in ("heuristic", "robust_heuristic", "standard", "full_batch"):
        assert payload[key] == pytest.approx(getattr(expected, key), rel=1e-12)
    assert round(payload["heuristic"], 3) == 2.222
    assert "not a proven bound" in payload["labels"]["heuristic"]


def test_table_output_labels_every_number(capsys):
    assert main(ARGS) == 0
    text = capsys.readouterr().out
    assert "2.2224" in text and "heuristic" in text and "standard composition" in text
    assert "final model only" in text


@pytest.mark.parametrize(
    "flag,value,interval",
    [("--sample-rate", "1.5", "(0, 1]"), ("--noise-multiplier", "0", "(0, inf)"),
     ("--delta", "1", "(0, 1)"), ("--delta", "nan", "(0, 1)")],
)
def test_bad_values_exit_2_with_the_option_named(flag, value, interval, capsys):
    args = list(ARGS)
    args[args.index(flag) + 1] = value
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    # the message opens with what the user typed: the option, its valid range, the value
    assert f"Invalid value for '{flag}': must be in {interval}, got {value}." in captured.err
    assert captured.out == ""


def test_negative_steps_rejected_by_the_parser(capsys):
    args = list(ARGS)
    args[args.index("--steps") + 1] = "-3"
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2 and "--steps" in capsys.readouterr().err
