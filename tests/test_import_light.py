"""The package root, the mathematics and the CLI's pure-math commands (epsilon in its three
modes, plan, normalisation, compare-versions, counterexample, --version and the analysis-only
figures of ``reproduce``) do not load torch or opacus (both installed here); Opacus still
finds our accountants whichever is imported first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import opacus_lastiterate
from opacus_lastiterate import accountants, analysis, exceptions

REPO = Path(__file__).resolve().parents[1]

_LIGHT_PROGRAM = """
import contextlib, importlib.util, io, sys

HEAVY = ("torch", "opacus")
assert all(importlib.util.find_spec(name) is not None for name in HEAVY), "torch/opacus missing"


def loaded(*names):
    return sorted({m.split(".")[0] for m in sys.modules} & set(names))


import opacus_lastiterate
import opacus_lastiterate.analysis
assert not loaded(*HEAVY, "dp_accounting"), ("root and analysis", loaded(*HEAVY, "dp_accounting"))
import opacus_lastiterate.analysis.audit
import opacus_lastiterate.analysis.normalisation
import opacus_lastiterate.exceptions
assert not loaded(*HEAVY), ("analysis subpackages", loaded(*HEAVY))

from opacus_lastiterate import DPSGDRun  # a lazy root name of the mathematics
from opacus_lastiterate.analysis.privacy_models import privacy_model
import opacus_lastiterate.analysis.normalisation as norm

run = DPSGDRun.constant(steps=3, sample_rate=0.1, noise_multiplier=1.0)
assert abs(privacy_model("heuristic", run).epsilon(1e-6) - 2.222) < 1e-3
norm.asgm_epsilon(1e-5, dataset_size=100, sample_rate=0.1, noise_multiplier=1.0, steps=3)
norm.feasgm_epsilon(
    1e-5, dataset_size=500, batch_size=10, noise_multiplier=1.0, steps=2, dimension=10
)
assert not loaded(*HEAVY), ("mathematics", loaded(*HEAVY))

from opacus_lastiterate.cli import main

dp_sgd = ["--steps", "20", "--sample-rate", "0.05", "--noise-multiplier", "1", "--delta", "1e-5"]
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(["--help"])
    except SystemExit as stop:
        assert stop.code == 0
    assert main(["epsilon", *dp_sgd]) == 0
    assert main(["epsilon", *dp_sgd, "--json", "--lr-schedule", "cosine", "--momentum", "0.5"]) == 0
    assert main(["counterexample", *dp_sgd, "--json"]) == 0
    assert main([
        "normalisation", "--dataset-size", "1000", "--batch-size", "50",
        "--noise-multiplier", "1", "--epochs", "1", "--delta", "1e-5", "--dimension", "10",
    ]) == 0
    assert main([
        "compare-versions", "--dataset-size", "147", "--batch-size", "3",
        "--noise-multiplier", "1", "--epochs", "1", "--delta", "1e-5", "--versions", "0.9.0..1.6.0",
    ]) == 0
    assert main(["--version"]) == 0
    assert main(["epsilon", *dp_sgd[:6], "--epsilon", "1"]) == 0
    assert main(["epsilon", *dp_sgd[:4], "--delta", "1e-5", "--target-epsilon", "2",
                 "--calibrate", "heuristic", "--calibrate", "full_batch"]) == 0
    assert main(["plan", "--dataset-size", "1000", "--batch-sizes", "50,100", "--epochs", "2",
                 "--target-epsilon", "2", "--delta", "1e-5", "--value-discretization-interval",
                 "1e-2"]) == 0
    assert main(["reproduce", "last-iterate-fig5", "--quick", "--no-plot"]) == 0
import opacus_lastiterate.auditing as auditing  # lazy: re-auditing run records needs no torch
assert callable(auditing.audit_records) and callable(auditing.read_records)
assert "heuristic" in out.getvalue() and "FEASGM" in out.getvalue()
assert "opacus-lastiterate" in out.getvalue() and "Figure 5" in out.getvalue()
assert not loaded(*HEAVY), ("cli", loaded(*HEAVY))
print("ok")
"""

_REGISTRATION_PROGRAM = """
{imports}
import sys
from opacus import PrivacyEngine
import opacus.accountants.utils

import opacus_lastiterate.accountants as ours

def created(mechanism):
    return type(PrivacyEngine(accountant=mechanism).accountant)

assert created("last_iterate") is ours.LastIterateAccountant
assert created("feasgm") is ours.FEASGMAccountant
assert created("asgm") is ours.ASGMAccountant
# make_private_with_epsilon creates accountants through this module's create_accountant
assert type(opacus.accountants.utils.create_accountant("last_iterate")) is ours.LastIterateAccountant
print("ok")
"""


def _run(program: str) -> subprocess.CompletedProcess[str]:
    """Run ``program`` in a fresh interpreter that imports this checkout's package."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONWARNINGS"] = "ignore"
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )


def test_root_analysis_and_cli_math_do_not_load_torch_or_opacus() -> None:
    result = _run(_LIGHT_PROGRAM)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize(
    "imports",
    [
        "import opacus\nimport opacus_lastiterate",  # opacus first: registered at once
        "import opacus_lastiterate\nimport opacus",  # ours first: registered by the hook
        "from opacus_lastiterate import LastIterateAccountant",  # opacus imported by ours
    ],
    ids=["opacus-first", "package-first", "lazy-name-first"],
)
def test_privacy_engine_finds_our_accountants_in_any_import_order(imports: str) -> None:
    result = _run(_REGISTRATION_PROGRAM.format(imports=imports))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_lazy_root_attributes_resolve() -> None:
    pkg = opacus_lastiterate
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, name
    assert pkg.LastIterateAccountant is accountants.LastIterateAccountant
    assert pkg.FEASGMAccountant is accountants.FEASGMAccountant
    assert pkg.use_public_divisor is accountants.use_public_divisor
    assert pkg.DPSGDRun is analysis.DPSGDRun
    assert pkg.OpacusLastIterateWarning is exceptions.OpacusLastIterateWarning
    assert pkg.analysis is analysis and pkg.exceptions is exceptions
    assert set(pkg.__all__) <= set(dir(pkg))
    assert {"analysis", "accountants", "auditing"} <= set(dir(pkg))
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = pkg.no_such_name  # type: ignore[attr-defined]


def test_lazy_analysis_attributes_resolve() -> None:
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    assert set(analysis.__all__) <= set(dir(analysis))
    assert analysis.last_iterate.heuristic.__name__ == "opacus_lastiterate.analysis.last_iterate.heuristic"
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = analysis.no_such_name  # type: ignore[attr-defined]
