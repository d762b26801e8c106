"""``opacus-lastiterate plan``: batch sizes with equal heuristic epsilon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opacus_lastiterate.analysis import standard_epsilon
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import main

ARGS = ["plan", "--dataset-size", "5000", "--batch-sizes", "500,100", "--epochs", "4",
        "--target-epsilon", "2", "--delta", "1e-5", "--value-discretization-interval", "1e-3"]


def test_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["batch_size"] for r in out["rows"]] == [500, 100]
    for r in out["rows"]:
        assert r["steps"] == 4 * 5000 // r["batch_size"] and r["sample_rate"] == r["batch_size"] / 5000
        kw = {"steps": r["steps"], "sample_rate": r["sample_rate"],
              "noise_multiplier": r["noise_multiplier"]}
        assert r["heuristic"] == privacy_model("heuristic", DPSGDRun.constant(**kw)).epsilon(1e-5) <= 2.0
        assert privacy_model("heuristic", DPSGDRun.constant(**{**kw, "noise_multiplier": r["noise_multiplier"] / 1.0002})).epsilon(1e-5) > 2
        assert r["standard"] == standard_epsilon(1e-5, value_discretization_interval=1e-3, **kw)
    assert out["rows"][1]["standard"] > out["rows"][0]["standard"]


def test_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main([*ARGS, "--plot", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "heuristic epsilon = 2 at delta = 1e-05" in text and "sigma/B" in text
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--batch-sizes", "500,9000"], "must be in [1, --dataset-size] = [1, "),
        (["--batch-sizes", "a,b"], "comma-separated integers"),
        (["--steps", "10"], "exactly one of --epochs and --steps"),
    ],
)
def test_usage_errors(change, message, capsys) -> None:  # type: ignore[no-untyped-def]
    args = list(ARGS)
    if change[0] in args:
        args[args.index(change[0]) + 1] = change[1]
    else:
        args += change
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_robust_heuristic_accountant_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--dataset-size", "1000", "--batch-sizes", "100", "--steps", "20",
            "--target-epsilon", "2", "--delta", "1e-5", "--json"]
    assert main([*args, "--accountant", "robust_heuristic"]) == 0
    assert json.loads(capsys.readouterr().out)["accountant"] == "robust_heuristic"
    for extra in (["--accountant", "robust"], ["--discretization", "1e-4"]):
        with pytest.raises(SystemExit) as stop:
            main([*args, *extra])
        assert stop.value.code == 2
        assert extra[0] in capsys.readouterr().err
