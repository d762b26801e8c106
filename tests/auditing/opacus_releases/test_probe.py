"""The real-code probe and the real-code audit against the installed Opacus.

The default suite runs Opacus 1.6.0, ``make test-compat`` runs Opacus 1.5.4; every other
release is probed by ``scripts/probe_opacus_versions.py`` (``make probe-versions``) and the
committed records are checked in ``tests/analysis/test_opacus_versions.py``.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("opacus")

from opacus_lastiterate.analysis.opacus_versions import (
    VersionConfig,
    installed_release,
    release,
    reported_epsilon,
)
from opacus_lastiterate.auditing.opacus_releases import probe as opacus_probe
from opacus_lastiterate.auditing.opacus_releases.agreement import check_probe
from opacus_lastiterate.auditing.opacus_releases.real_code_audit import (
    audit_installed_opacus,
    feasgm_scores,
    summarise_audit,
)

PROBE_FILES = ("probe.py", "_driver.py", "_observations.py")  # probe.py and what it loads


@pytest.mark.parametrize("name", PROBE_FILES)
def test_probe_module_imports_only_the_standard_library_torch_numpy_and_opacus(name: str) -> None:
    # the sweep runs probe.py by path in environments that hold one Opacus release only
    tree = ast.parse((Path(opacus_probe.__file__).parent / name).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= set(sys.stdlib_module_names) | {"torch", "numpy", "opacus"}
    relative = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level for a in n.names}
    loaded = {
        n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute) and n.func.attr == "import_module"
        and isinstance(n.args[0], ast.Constant)
    }  # fmt: skip
    assert {f"{m}.py" for m in relative | loaded} <= set(PROBE_FILES)
    assert relative == loaded  # by path, the same siblings as in the package


@pytest.mark.slow  # a fresh interpreter imports torch and opacus (~10-20 s)
def test_probe_runs_by_path_without_the_package_as_in_the_package(tmp_path: Path) -> None:
    # the sweep's way (scripts/probe_opacus_versions.py): the file by path, from a folder that
    # is not the repository; here the package cannot be imported at all
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opacus_lastiterate':\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), OMP_NUM_THREADS="1")
    config = dict(trials=2, steps=3, dimension=5, others=9, batch_size=5, noise_multiplier=1.0)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in config.items()]
    result = subprocess.run(
        [sys.executable, opacus_probe.__file__, "audit", "--seed=4", "--out=obs.npz", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    by_path = np.load(tmp_path / "obs.npz")
    here = opacus_probe.audit_observations(with_canary=True, seed=5, **config)
    for key in ("u", "v", "status"):
        np.testing.assert_array_equal(by_path[f"with_{key}"], np.asarray(here[key]))
    assert float(by_path["with_reported_epsilon"]) == here["reported_epsilon"]


def test_api_generation_follows_the_releases() -> None:
    assert opacus_probe.api_generation("0.9.0") == "engine-fixed"
    assert opacus_probe.api_generation("0.11.0") == "engine-fixed"
    assert opacus_probe.api_generation("0.12.0") == "engine"
    assert opacus_probe.api_generation("0.15.0") == "engine"
    assert opacus_probe.api_generation("1.5") == "make_private"
    assert opacus_probe.api_generation("1.6.0+cpu") == "make_private"


def test_probe_of_installed_opacus_agrees_with_the_version_model() -> None:
    record = opacus_probe.run_probe(seed=0)
    rel = installed_release()
    assert rel is not None and rel.key == release(record["opacus"]).key
    assert record["shims"] == []  # 1.x imports and runs on current torch as it is
    report = check_probe(record)
    assert report.agrees, report.summary()
    checked = {(c.case, c.what) for c in report.checks}
    assert ("divisor", "divisor (noise off)") in checked
    assert ("noise", "noise scale") in checked
    assert ("noise", "reported epsilon") in checked
    assert ("accountant", "reported epsilon") in checked
    assert ("sum", "noise scale") in checked


def test_probe_measures_what_it_claims() -> None:
    # the record itself, read without the model: 1.x divides every batch of (200, 30) by 28
    # (Opacus's own optimizer attribute), whatever the realised size
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    record = opacus_probe.run_probe(seed=1)
    first = next(c for c in record["cases"] if c["case"] == "divisor")
    model = torch.nn.Linear(2, 1)
    _, opt, _ = PrivacyEngine().make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        data_loader=DataLoader(TensorDataset(torch.zeros(200, 2)), batch_size=30),
        noise_multiplier=1.0, max_grad_norm=1.0,
    )
    sizes = {s["b"] for s in first["steps"]}
    assert len(sizes) > 1  # Poisson batch sizes vary ...
    for s in first["steps"]:  # ... the divisor does not
        assert s["b"] / s["g0"] == pytest.approx(opt.expected_batch_size, rel=1e-6)
        assert s["rest_max"] == 0.0


def test_audit_scores_count_empty_steps_as_log_one_minus_q() -> None:
    u = np.array([[0.1, np.nan], [0.2, 0.3]])
    v = np.array([[9.0, np.nan], [8.0, 7.0]])
    status = np.array([[0, opacus_probe.STATUS_DROPPED], [0, 0]])
    obs = {f"{w}_{k}": a for w in ("with", "without") for k, a in (("u", u), ("v", v), ("status", status))}
    kw = dict(divisor_without=9.0, divisor_with=10.0, sample_rate=0.1, noise_multiplier=2.0, dimension=100)
    ins, outs = feasgm_scores(obs, **kw)
    from opacus_lastiterate.analysis.normalisation.divisor_leak import divisor_leak_loss

    expected0 = float(divisor_leak_loss(0.1, 9.0, **kw)) + math.log(0.9)
    assert ins[0] == pytest.approx(expected0) and outs[0] == pytest.approx(expected0)
    bad = dict(obs, with_u=np.array([[np.nan, np.nan], [0.2, 0.3]]))
    with pytest.raises(ValueError, match="NaN"):
        feasgm_scores(bad, **kw)
    with pytest.raises(ValueError, match="one shape"):
        feasgm_scores(dict(obs, with_v=v[:1]), **kw)
    with pytest.raises(ValueError, match="batch_size"):
        summarise_audit(dict(obs, opacus="1.6.0", with_reported_epsilon=0.1), mechanism="FEASGM",
                        others=9, noise_multiplier=2.0, steps=2, dimension=100)


def test_real_opacus_leaks_beyond_its_reported_epsilon() -> None:
    """Worst case on the installed Opacus 1.x: N = 100 with the canary, batch size 10, so the
    divisor is 10 with the canary and 9 without (q = 0.1 in both worlds)."""
    steps = 4
    audit = audit_installed_opacus(trials=60, steps=steps, dimension=1000, noise_multiplier=2.0)
    rel = installed_release()
    assert rel is not None
    # what Opacus prints is its own accountant, which the version model reproduces
    model = reported_epsilon(rel, VersionConfig(100, 10, 2.0, 1e-5, epochs=None, steps=steps))
    tolerance = 1e-6 if rel.default_accountant == "prv" else 1e-6 * model  # its own arithmetic
    assert audit.eps_reported == pytest.approx(model, abs=tolerance)
    assert audit.eps_audit.kind == "bound" and audit.eps_audit.confidence == 0.95
    assert audit.eps_audit.epsilon > audit.eps_reported  # the leak, measured on real code
    assert math.isinf(audit.eps_corrected)  # FEASGM verdict: unsafe
    assert audit.eps_audit.epsilon <= audit.eps_config  # below the exact epsilon of the setting
    assert audit.config["divisors"] == [9.0, 10.0]
