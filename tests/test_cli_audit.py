"""``opacus-lastiterate audit``: re-auditing a run-records file, and the digits audit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from opacus_lastiterate.analysis import gaussian_epsilon, standard_epsilon
from opacus_lastiterate.analysis.audit import HeldOutSplit, NaiveMax
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.auditing import AuditRunner, audit_records
from opacus_lastiterate.cli import main

MU = 2.0  # the scores below are N(MU, 1) with the canary and N(0, 1) without: MU-GDP


def train(include_canary: bool, seed: int) -> float:
    return float(np.random.default_rng(seed).normal(MU if include_canary else 0.0))


def score(model: float) -> float:
    return model


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "runs.jsonl"
    AuditRunner(train, score, num_runs=400, seed=3, path=path, workers=0, progress=False).run()
    return path


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_records_bound_is_the_runner_audit_and_below_the_truth(records, capsys) -> None:  # type: ignore[no-untyped-def]
    out = _json(capsys, "audit", "records", str(records), "--delta", "1e-5")
    direct = audit_records(records, delta=1e-5)
    audit = out["audit"]
    assert audit["epsilon"] == direct.epsilon and audit["kind"] == "bound"
    assert out["runs"] == 400 and out["runs_with_canary"] + out["runs_without_canary"] == 400
    # a valid lower bound of a MU-GDP mechanism (fixed seed; fails with prob. <= 5%)
    assert 0 < audit["epsilon"] <= gaussian_epsilon(mu=MU, delta=1e-5)


@pytest.mark.parametrize(
    ("flags", "kind", "strategy"),
    [
        (["--threshold", "naive-max"], "invalid", NaiveMax()),
        (["--threshold", "held-out", "--seed", "1"], "bound", HeldOutSplit(seed=1)),
        (["--method", "gaussian-dp"], "estimate", None),
    ],
)
def test_records_options(records, capsys, flags, kind, strategy) -> None:  # type: ignore[no-untyped-def]
    out = _json(capsys, "audit", "records", str(records), "--delta", "1e-5",
                "--confidence", "0.9", "--num-runs", "300", *flags)
    assert out["audit"]["kind"] == kind and out["runs"] == 300
    kwargs = {"threshold_strategy": strategy} if strategy is not None else {
        "method": "gaussian-dp"}
    direct = audit_records(records, delta=1e-5, confidence=0.9, num_runs=300, **kwargs)
    assert out["audit"]["epsilon"] == direct.epsilon


def test_records_text_and_plot(records, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    assert main(["audit", "records", str(records), "--plot", str(tmp_path / "s.png")]) == 0
    text = capsys.readouterr().out
    assert "400 runs" in text and "epsilon >= " in text and "lower bound" in text
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


def test_missing_records_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        main(["audit", "records", str(tmp_path / "none.jsonl")])
    assert stop.value.code == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_digits_quick(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "runs.jsonl"
    out = _json(capsys, "audit", "digits", "--quick", "--records", str(path))
    c = out["configuration"]
    assert c["runs"] == 24 and c["steps"] == 10 and out["trained"] == 24 and path.exists()
    kw = {"steps": 10, "sample_rate": c["sample_rate"], "noise_multiplier": 0.5}
    assert out["heuristic"] == privacy_model("heuristic", DPSGDRun.constant(**kw)).epsilon(1e-5)
    assert out["standard"] == standard_epsilon(1e-5, **kw)
    assert out["audit"]["epsilon"] <= out["standard"]
    # the records re-audit gives the same number
    again = _json(capsys, "audit", "records", str(path))
    assert again["audit"]["epsilon"] == out["audit"]["epsilon"]
