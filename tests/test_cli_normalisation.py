"""``opacus-lastiterate normalisation``: SGM, FEASGM verdict, corrected and ASGM epsilons."""

from __future__ import annotations

import json
import math

import pytest

from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.analysis.normalisation import asgm_epsilon
from opacus_lastiterate.analysis.normalisation.divisor_leak import feasgm_epsilon
from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict
from opacus_lastiterate.cli import main


def _args(n: int, b: int, sigma: float, epochs: int, delta: float, *extra: str) -> list[str]:
    return [
        "normalisation",
        "--dataset-size",
        str(n),
        "--batch-size",
        str(b),
        "--noise-multiplier",
        str(sigma),
        "--epochs",
        str(epochs),
        "--delta",
        str(delta),
        *extra,
    ]


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_safe_mnist_like_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, *_args(60000, 256, 1.0, 1, 1e-5))
    assert out["steps_per_epoch"] == 235 and out["steps"] == 235
    sgm = standard_epsilon(1e-5, steps=235, sample_rate=1 / 235, noise_multiplier=1.0)
    assert out["sgm"]["epsilon"] == pytest.approx(sgm, rel=1e-12)
    v = out["feasgm_verdict"]
    assert v["verdict"] == "safe" and v["divisors"] == [255.0] * 3
    assert v["dataset_sizes"] == [59999, 60000, 60001]
    assert out["corrected"]["epsilon"] == out["sgm"]["epsilon"] and out["curve"] is None
    asgm = asgm_epsilon(
        1e-5, dataset_size=60000, sample_rate=1 / 235, noise_multiplier=1.0, steps=235
    )
    assert out["asgm"]["epsilon"] == pytest.approx(asgm, rel=1e-12)
    for key in ("sgm", "corrected", "asgm"):
        assert out[key]["model"]
    assert "ASGM (batch size revealed" in out["asgm"]["model"]


def test_steps_per_epoch_follow_opacus_float_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    # len(DataLoader) = 93 but int(1 / (1 / 93)) = 92: Opacus runs and accounts 92 steps/epoch
    out = _json(capsys, *_args(9300, 100, 1.0, 2, 1e-5))
    assert out["steps_per_epoch"] == 92 and out["steps"] == 184
    assert out["sample_rate"] == 1 / 92 and out["expected_batch_size"] == 101
    assert out["feasgm_verdict"]["verdict"] == feasgm_verdict(9300, 100).verdict == "unsafe"
    assert out["corrected"]["epsilon"] == "inf"


def test_unsafe_configuration_prints_inf_reason_and_curve(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(_args(10, 8, 1.0, 2, 1e-5, "--dimension", "20")) == 0
    text = capsys.readouterr().out
    verdict = feasgm_verdict(10, 8)
    assert not verdict.safe and verdict.reason in text
    curve = feasgm_epsilon(
        1e-5, dataset_size=10, batch_size=8, noise_multiplier=1.0, steps=4, dimension=20
    )
    lines = {
        line.split()[0]: line for line in text.splitlines() if "epsilon" in line and "[" in line
    }
    assert "inf" in lines["corrected"] and "unsafe" in lines["corrected"]
    assert f"{curve:.4f}" in lines["curve"] and "d = 20" in lines["curve"]
    assert "SGM (" in lines["SGM"] and "ASGM (" in lines["ASGM"]
    for size, divisor in zip(verdict.dataset_sizes, verdict.divisors):
        assert any(line.split()[:2] == [str(size), f"{divisor:g}"] for line in text.splitlines())


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--dataset-size", "1"),
        ("--batch-size", "0"),
        ("--noise-multiplier", "0"),
        ("--noise-multiplier", "nan"),
        ("--epochs", "0"),
        ("--delta", "1.5"),
        ("--dimension", "0"),
    ],
)
def test_bad_values_exit_2_naming_the_parameter(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    args = _args(100, 10, 1.0, 1, 1e-5)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_inf_is_strict_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_args(10, 8, 1.0, 1, 1e-5), "--json"]) == 0

    def reject(constant: str) -> None:
        raise AssertionError(f"non-standard JSON constant {constant}")

    out = json.loads(capsys.readouterr().out, parse_constant=reject)
    assert out["corrected"]["epsilon"] == "inf" and out["asgm"]["epsilon"] == "inf"
    assert math.isfinite(out["sgm"]["epsilon"])


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_batch_larger_than_the_data_set_is_a_usage_error_like_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refused(capsys, _args(50000, 60000, 1.0, 1, 1e-5))
    assert ("Invalid value for '--batch-size': must be in [1, --dataset-size] = [1, 50000], "
            "got 60000.") in err
    # plan refuses the same batch size with the same message
    err = _refused(capsys, ["plan", "--dataset-size", "50000", "--batch-sizes", "60000",
                            "--target-epsilon", "2", "--delta", "1e-5", "--steps", "10"])
    assert ("Invalid value for '--batch-sizes': must be in [1, --dataset-size] = [1, 50000], "
            "got 60000.") in err


def test_drop_last_needs_a_batch_below_the_data_set_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refused(capsys, [*_args(50000, 50000, 1.0, 1, 1e-5), "--drop-last"])
    assert ("Invalid value for '--batch-size': must be in [1, --dataset-size - 1] = "
            "[1, 49999] with --drop-last") in err and "got 50000." in err


def test_batch_equal_to_the_data_set_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, *_args(1000, 1000, 1.0, 1, 1e-5))
    assert out["steps_per_epoch"] == 1
