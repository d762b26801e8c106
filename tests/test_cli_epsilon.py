"""``opacus-lastiterate epsilon``: delta at an epsilon, calibration, --plot, --version and
how warnings and usage errors are shown."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from opacus_lastiterate.analysis import (
    FullBatchGaussian,
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
    StandardComposition,
    standard_epsilon,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import main

BASE = ["epsilon", "--steps", "20", "--sample-rate", "0.05"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_delta_at_epsilon_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, *BASE, "--noise-multiplier", "1", "--epsilon", "1.5",
                "--value-discretization-interval", "1e-3")
    assert out["quantity"] == "delta" and out["epsilon"] == 1.5
    run = DPSGDRun.constant(steps=20, sample_rate=0.05, noise_multiplier=1.0)
    models = {"heuristic": LastIterateHeuristic(run), "robust_heuristic":
              RobustLastIterateHeuristic(run), "standard": StandardComposition(run, value_discretization_interval=1e-3),
              "full_batch": FullBatchGaussian(run)}
    for key, model in models.items():
        assert out[key] == model.delta(1.5), key
        # the inverse direction: epsilon at that delta is 1.5 again
        assert model.epsilon(out[key]) == pytest.approx(1.5, rel=1e-3, abs=1e-3), key
    assert out["standard"] > out["heuristic"]


def test_calibration_meets_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, *BASE, "--delta", "1e-5", "--target-epsilon", "3",
                "--calibrate", "heuristic", "--calibrate", "standard", "--value-discretization-interval", "1e-3")
    rows = {r["accountant"]: r for r in out["calibrations"]}
    assert set(rows) == {"heuristic", "standard"}
    kw = {"steps": 20, "sample_rate": 0.05}
    h = rows["heuristic"]["noise_multiplier"]
    assert rows["heuristic"]["heuristic"] == privacy_model("heuristic", DPSGDRun.constant(noise_multiplier=h, **kw)).epsilon(1e-5) <= 3
    assert privacy_model("heuristic", DPSGDRun.constant(noise_multiplier=h / 1.0002, **kw)).epsilon(1e-5) > 3
    s = rows["standard"]["noise_multiplier"]
    assert rows["standard"]["standard"] == standard_epsilon(
        1e-5, noise_multiplier=s, value_discretization_interval=1e-3, **kw) <= 3
    assert s > h  # the standard bound needs more noise than the heuristic


def test_calibration_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BASE, "--delta", "1e-5", "--target-epsilon", "3", "--calibrate",
                 "heuristic", "--value-discretization-interval", "1e-3"]) == 0
    text = capsys.readouterr().out
    assert "noise multiplier for epsilon <= 3" in text and "calibrated to" in text
    assert "not a proven bound for deep networks" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--noise-multiplier", "1", "--delta", "1e-5", "--epsilon", "1"], "exactly one of"),
        (["--noise-multiplier", "1"], "exactly one of"),
        (["--delta", "1e-5"], "--noise-multiplier"),
        (["--noise-multiplier", "1", "--delta", "1e-5", "--target-epsilon", "2"],
         "leave out --noise-multiplier"),
        (["--target-epsilon", "2"], "needs --delta"),
        (["--noise-multiplier", "1", "--delta", "1e-5", "--calibrate", "standard"],
         "--calibrate needs --target-epsilon"),
        (["--noise-multiplier", "1", "--epsilon", "1", "--plot", "x.png"], "pass --delta"),
        (["--noise-multiplier", "1", "--delta", "1e-5", "--plot", "x.txt"], "'--plot'"),
    ],
)
def test_usage_errors_say_what_to_change(extra, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        main([*BASE, *extra])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_plot_writes_a_picture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "eps.png"
    out = _json(capsys, *BASE, "--noise-multiplier", "1", "--delta", "1e-5",
                "--value-discretization-interval", "1e-3", "--plot", str(path))
    assert out["heuristic"] > 0 and path.read_bytes()[:4] == b"\x89PNG"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from opacus_lastiterate import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"opacus-lastiterate {__version__} (")


def test_warnings_are_one_line_opening_with_the_command(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import opacus_lastiterate.analysis.comparison as comparison

    original = comparison.compare_epsilons_for_history

    def noisy(*args, **kwargs):  # type: ignore[no-untyped-def]
        warnings.warn("something the user should know", UserWarning, stacklevel=2)
        return original(*args, **kwargs)

    monkeypatch.setattr(comparison, "compare_epsilons_for_history", noisy)
    assert main([*BASE, "--noise-multiplier", "1", "--delta", "1e-5", "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays one JSON object
    assert captured.err == "opacus-lastiterate epsilon: warning: something the user should know\n"


def test_analysis_errors_exit_2_with_the_command_named(capsys) -> None:  # type: ignore[no-untyped-def]
    # steps = 0 has no calibration: the analysis refuses it, the CLI says which command failed
    with pytest.raises(SystemExit) as stop:
        main(["epsilon", "--steps", "0", "--sample-rate", "0.1", "--delta", "1e-5",
              "--target-epsilon", "1"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("opacus-lastiterate epsilon: error: ") and "`steps`" in err


def test_only_the_listed_names_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """The interval is --value-discretization-interval, the robust heuristic
    robust_heuristic: other spellings are usage errors."""
    for extra in (["--noise-multiplier", "1", "--discretization", "1e-3"],
                  ["--target-epsilon", "3", "--calibrate", "robust"]):
        with pytest.raises(SystemExit) as stop:
            main([*BASE, "--delta", "1e-5", *extra])
        assert stop.value.code == 2
        assert extra[-2] in capsys.readouterr().err


def test_interval_default_is_the_standard_models_default() -> None:
    from opacus_lastiterate.analysis.baselines.composition import DEFAULT_DISCRETIZATION
    from opacus_lastiterate.analysis.privacy_models import PRIVACY_MODELS
    from opacus_lastiterate.cli._options import DEFAULT_INTERVAL

    assert DEFAULT_INTERVAL == DEFAULT_DISCRETIZATION == 1e-4
    assert PRIVACY_MODELS["standard"].defaults["value_discretization_interval"] == 1e-4


@pytest.mark.parametrize(("extra", "message"), [
    (["--sampling", "shuffled"], "--sampling shuffled needs --dataset-size"),
    (["--dataset-size", "100"], "--dataset-size describes shuffled or deterministic"),
    (["--sampling", "balls-in-bins", "--momentum", "0.9"], "leave out --plot, --lr-schedule"),
    (["--sampling", "shuffled", "--dataset-size", "7"], "--sample-rate"),
])
def test_sampling_options_are_checked_before_any_computation(extra, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        main([*BASE, "--noise-multiplier", "1", "--delta", "1e-5", *extra])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
