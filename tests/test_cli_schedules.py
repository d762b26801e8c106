"""CLI: --lr-schedule / --momentum on `epsilon`, and the `counterexample` subcommand."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_epsilon_result,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import main

BASE = ["--sample-rate", "0.05", "--noise-multiplier", "1.0", "--delta", "1e-6"]


def _json(capsys, argv):
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_constant_schedule_without_momentum_is_the_plain_heuristic(capsys):
    out = _json(capsys, ["epsilon", "--steps", "40", *BASE, "--lr-schedule", "constant"])
    assert out["weighted_heuristic"] == pytest.approx(out["heuristic"], rel=1e-9)
    assert "schedule/momentum weights" in out["labels"]["weighted_heuristic"]


def test_momentum_uses_the_momentum_weights(capsys):
    T, beta = 30, 0.9
    out = _json(capsys, ["epsilon", "--steps", str(T), *BASE, "--momentum", str(beta)])
    # Weight of step t (1-based) at constant rate: (1 - beta^(T-t+1)) / (1 - beta).
    w = np.array([(1 - beta ** (T - t + 1)) / (1 - beta) for t in range(1, T + 1)])
    ref = weighted_heuristic_epsilon_result(1e-6, weights=w, sample_rates=0.05, noise_multipliers=1.0)
    assert out["weighted_heuristic"] == pytest.approx(ref.epsilon, rel=1e-9)
    assert out["weighted_heuristic"] != pytest.approx(out["heuristic"], rel=1e-3)


def test_schedule_file(capsys, tmp_path):
    rates = np.r_[np.full(10, 0.5), np.full(10, 0.05)]
    path = tmp_path / "lr.txt"
    np.savetxt(path, rates)
    out = _json(capsys, ["epsilon", "--steps", "20", *BASE, "--lr-schedule", str(path)])
    ref = weighted_heuristic_epsilon_result(1e-6, weights=rates, sample_rates=0.05, noise_multipliers=1.0)
    assert out["weighted_heuristic"] == pytest.approx(ref.epsilon, rel=1e-9)
    with pytest.raises(SystemExit) as exit_info:
        main(["epsilon", "--steps", "21", *BASE, "--lr-schedule", str(path)])
    assert exit_info.value.code == 2
    assert "--lr-schedule" in capsys.readouterr().err


def test_unknown_schedule_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["epsilon", "--steps", "5", *BASE, "--lr-schedule", "no-such-schedule"])
    assert exit_info.value.code == 2
    assert "constant, step, cosine" in capsys.readouterr().err


def test_counterexample_reproduces_the_paper(capsys):
    out = _json(capsys, ["counterexample", "--steps", "3", "--sample-rate", "0.1",
                         "--noise-multiplier", "1", "--delta", "1e-6", "--alpha", "0.5"])
    assert round(out["heuristic"], 3) == 2.222
    assert round(out["one_step"], 3) == 2.182
    assert out["quadratic"] > 2.274 and out["exceeds_heuristic"] is True
    assert out["robust_heuristic"] == pytest.approx(
        privacy_model("robust_heuristic", DPSGDRun.constant(steps=3, sample_rate=0.1, noise_multiplier=1.0)).epsilon(1e-6)
    )
    assert out["ratio_to_robust"] == pytest.approx(out["quadratic"] / out["robust_heuristic"])


def test_counterexample_table(capsys):
    assert main(["counterexample", "--steps", "3", "--sample-rate", "0.1",
                 "--noise-multiplier", "1", "--delta", "1e-6"]) == 0
    text = capsys.readouterr().out
    assert "exceeds the heuristic" in text and "zeroing regulariser" in text


@pytest.mark.parametrize(("text", "line", "column", "value"), [
    ("0.5\nabc\n0.5\n", 2, 1, "'abc' is not a number"),
    ("# learning rate\n0.5\n0.5 -1\n", 3, 2, "'-1' is not a finite number >= 0"),
    ("lr\n0.5\n0.5\n", 1, 1, "'lr' is not a number (a header line must start with #)"),
    ("0.5, 0.5\n\n0.5 nan # last\n", 3, 2, "'nan' is not a finite number >= 0"),
])
def test_a_bad_schedule_file_names_the_option_the_file_and_the_line(
    capsys, tmp_path, monkeypatch, text, line, column, value
):
    """The line number is the file's own (1-based, comments and blank lines counted), the
    column the field on that line; nothing is computed before the error."""
    import opacus_lastiterate.analysis.comparison as comparison

    def never(*args, **kwargs):
        raise AssertionError("computed although the schedule file is bad")

    monkeypatch.setattr(comparison, "compare_epsilons", never)
    path = tmp_path / "rates.txt"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        main(["epsilon", "--steps", "3", *BASE, "--lr-schedule", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (f"Invalid value for '--lr-schedule': '{path}', line {line}, column {column}: "
            f"{value}") in err


def test_a_schedule_file_may_hold_comments_and_commas(capsys, tmp_path):
    rates = [0.5, 0.4, 0.3, 0.2]
    path = tmp_path / "rates.csv"
    path.write_text("# step rates\n0.5, 0.4\n\n0.3  # third\n0.2\n")
    out = _json(capsys, ["epsilon", "--steps", "4", *BASE, "--lr-schedule", str(path)])
    ref = weighted_heuristic_epsilon_result(1e-6, weights=rates, sample_rates=0.05,
                                            noise_multipliers=1.0)
    assert out["weighted_heuristic"] == pytest.approx(ref.epsilon, rel=1e-9)
