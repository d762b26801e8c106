"""The Opacus version model: the 26 releases, the exact 1.x divisor, each version's own
epsilon, and agreement with the committed real-code probes of every release (the probe of
the installed Opacus runs in ``tests/auditing/opacus_releases/test_probe.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opacus_lastiterate.analysis.normalisation import opacus1x_batch_arithmetic
from opacus_lastiterate.analysis.opacus_versions import (
    OPACUS_RELEASES,
    ExampleWeighting,
    VersionConfig,
    compare_versions,
    corrected_epsilon,
    divisor,
    example_weighting,
    installed_release,
    installed_version,
    release,
    releases_between,
    reported_epsilon,
)

PYPI = (
    "0.9.0 0.9.1 0.10.0 0.10.1 0.11.0 0.12.0 0.13.0 0.14.0 0.15.0 1.0.0 1.0.1 1.0.2 1.1.0 "
    "1.1.1 1.1.2 1.1.3 1.2.0 1.3.0 1.4.0 1.4.1 1.5 1.5.1 1.5.2 1.5.3 1.5.4 1.6.0"
).split()


def test_table_covers_exactly_the_26_pypi_releases() -> None:
    assert [r.version for r in OPACUS_RELEASES] == PYPI
    assert all(r.source for r in OPACUS_RELEASES)
    assert {r.mechanism for r in OPACUS_RELEASES if r.key < (1, 0, 0)} == {"ASGM"}
    assert {r.mechanism for r in OPACUS_RELEASES if r.key >= (1, 0, 0)} == {"FEASGM"}
    assert next(r.version for r in OPACUS_RELEASES if r.default_accountant == "prv") == "1.3.0"
    assert release("1.5.0") is release("1.5")
    assert [r.version for r in releases_between("1.4.1..1.5.1")] == ["1.4.1", "1.5", "1.5.1"]
    with pytest.raises(ValueError, match="unknown Opacus version"):
        release("1.7.0")


@pytest.mark.parametrize(
    ("n", "b", "expected"), [(147, 3, 2), (9300, 100, 101), (49, 1, 0), (200, 30, 28)]
)
def test_1x_divisor_is_opacus_float_expression(n: int, b: int, expected: int) -> None:
    for rel in releases_between("1.0.0..1.6.0"):
        assert divisor(rel, n, b) == expected == opacus1x_batch_arithmetic(n, b).expected_batch_size
    assert divisor("0.13.0", n, b, realised_batch_size=7) == 7
    assert divisor("1.6.0", n, b, loss_reduction="sum") == 1


def test_installed_version_is_read_without_importing_opacus() -> None:
    from importlib import metadata

    assert installed_version() == metadata.version("opacus")
    rel = installed_release()
    assert rel is not None and rel.key == release(metadata.version("opacus")).key


def test_reported_epsilon_reproduces_each_conversion() -> None:
    # q = 0.01, sigma = 1.1, 1000 steps, delta = 1e-5 (N = 10000, L = 100)
    cfg = VersionConfig(10_000, 100, 1.1, 1e-5, epochs=None, steps=1000)
    assert reported_epsilon("0.13.0", cfg) == pytest.approx(2.0821, abs=1e-4)  # classic
    assert reported_epsilon("1.2.0", cfg) == pytest.approx(1.7118, abs=1e-4)  # improved
    assert reported_epsilon("1.6.0", cfg) == pytest.approx(1.5255, abs=0.02)  # PRV


def test_reported_matches_installed_opacus_accountants() -> None:
    pytest.importorskip("opacus")
    from opacus.accountants import PRVAccountant, RDPAccountant

    cfg = VersionConfig(9300, 100, 1.0, 1e-5, epochs=2)
    q = opacus1x_batch_arithmetic(9300, 100).accountant_rate
    steps = 2 * opacus1x_batch_arithmetic(9300, 100).steps_per_epoch
    rdp, prv = RDPAccountant(), PRVAccountant()
    rdp.history = [(1.0, q, steps)]
    prv.history = [(1.0, q, steps)]
    # dp_accounting's RDP of the subsampled Gaussian and Opacus's implementation of the same
    # analysis differ by about 1e-7 relative at fractional orders (measured 1.1e-7)
    assert reported_epsilon("1.2.0", cfg) == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-6)
    assert reported_epsilon("1.6.0", cfg) == pytest.approx(prv.get_epsilon(1e-5), abs=0.02)


def test_installed_dataloader_arithmetic_matches_the_model() -> None:
    pytest.importorskip("opacus")
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    rel = installed_release()
    assert rel is not None and rel.family == "1.x"
    for n, b in [(147, 3), (9300, 100), (49, 1)]:
        data = TensorDataset(torch.zeros(n, 1))
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        _, opt, loader = PrivacyEngine().make_private(
            module=model, optimizer=opt, data_loader=DataLoader(data, batch_size=b),
            noise_multiplier=1.0, max_grad_norm=1.0,
        )
        assert opt.expected_batch_size == divisor(rel, n, b)
        assert len(loader) == opacus1x_batch_arithmetic(n, b).steps_per_epoch


def test_compare_versions_flags() -> None:
    rows = {r.version: r for r in compare_versions(VersionConfig(147, 3, 1.0, 1e-5, epochs=1))}
    assert len(rows) == 26
    assert math.isinf(rows["1.6.0"].corrected)  # divisor changes between neighbours
    assert any("crash on empty batch" in w for w in rows["1.0.0"].warnings)
    assert not any("crash on empty" in w for w in rows["1.3.0"].warnings)
    assert any("fixed-size shuffled" in w for w in rows["0.9.0"].warnings)
    zero = {r.version: r for r in compare_versions(VersionConfig(49, 1, 1.0, 1e-5, epochs=1), "1.6.0")}
    assert any("divisor 0" in w for w in zero["1.6.0"].warnings)
    big = compare_versions(VersionConfig(9300, 100, 1.0, 1e-5, epochs=1), "1.6.0")[0]
    assert any("above the batch size" in w for w in big.warnings)
    assert any("sample rate mismatch" in w for w in big.warnings)
    shuffled = compare_versions(VersionConfig(60000, 256, 1.1, 1e-5, poisson=False), "1.6.0")[0]
    assert any("fixed-size shuffled" in w for w in shuffled.warnings)
    safe = VersionConfig(60000, 256, 1.1, 1e-5, epochs=1)
    eps, model = corrected_epsilon("1.6.0", safe)
    assert "safe" in model and eps == pytest.approx(reported_epsilon("1.6.0", safe), rel=0.05)


# -- the committed real-code probes of every release ----------------------------------------

PROBES = Path(__file__).resolve().parents[2] / "docs" / "results" / "opacus_probes.json"


def _probe_records() -> dict[tuple[str, str], dict]:
    data = json.loads(PROBES.read_text())
    return {(r["track"], r["opacus"]): r for r in data["records"]}


def test_committed_probes_cover_every_release_and_agree_with_the_model() -> None:
    from opacus_lastiterate.auditing.opacus_releases.agreement import check_probe

    data = json.loads(PROBES.read_text())
    assert data["command"].startswith("python scripts/probe_opacus_versions.py")
    records = _probe_records()
    probed = {v for (track, v) in records if track == "current"}
    missing = {f["opacus"]: f["reason"] for f in data["could_not_run"] if f["track"] == "current"}
    assert probed | set(missing) == set(PYPI) and all(missing.values())
    native = {v for (track, v) in records if track == "native"}
    assert native == {v for v in PYPI if release(v).key < (1, 0, 0)} - {
        f["opacus"] for f in data["could_not_run"] if f["track"] == "native"
    }
    for (track, version), record in records.items():
        report = check_probe(record)
        assert report.agrees, f"{track}: {report.summary()}"
        cases = {c["case"] for c in record["cases"]}
        assert {"divisor", "noise", "accountant", "empty", "sum"} <= cases, version
    # the shims are exactly the documented ones, and only on current torch
    shims = {v: tuple(r["shims"]) for (t, v), r in records.items() if t == "current" and r["shims"]}
    assert shims == {
        **{v: ("torchcsprng",) for v in ("0.9.0", "0.9.1", "0.10.0", "0.10.1")},
        "0.11.0": ("ModuleAttributeError",),
        **{v: ("zero_grad(set_to_none=False)",) for v in ("0.14.0", "0.15.0")},
    }
    assert all(not r["shims"] for (t, _), r in records.items() if t == "native")


@pytest.mark.parametrize(
    ("measured", "model", "difference"),
    [
        ("0.11.0", "0.12.0", "a batch above batch_size raises ValueError"),
        ("0.13.0", "0.14.0", "classic vs improved RDP conversion; empty batches crash vs dropped"),
        ("0.14.0", "0.15.0", "loss_reduction='sum' per-example weighting"),
        ("0.15.0", "1.0.0", "realised batch size vs int(N * q)"),
        ("1.2.0", "1.3.0", "empty batches crash vs noise-only steps; RDP vs PRV"),
    ],
)
def test_probes_tell_neighbouring_releases_apart(measured: str, model: str, difference: str) -> None:
    """A record checked against the next release's row disagrees: the checks can fail, and
    the committed records pin down each row of the table ({difference})."""
    from opacus_lastiterate.auditing.opacus_releases.agreement import check_probe

    record = dict(_probe_records()[("current", measured)], opacus=model)
    assert not check_probe(record).agrees


def test_example_weighting_of_sum_reduction() -> None:
    for version in ("0.9.0", "0.9.1"):  # |B| g_i clipped at C, the sum divided by |B|
        assert example_weighting(version, 30, loss_reduction="sum") == ExampleWeighting(1 / 30, 1.0)
    # |B| g_i clipped at C and summed
    assert example_weighting("0.14.0", 30, loss_reduction="sum") == ExampleWeighting(1 / 30, 30.0)
    for version in ("0.10.0", "0.15.0", "1.0.0", "1.6.0"):
        assert example_weighting(version, 30, loss_reduction="sum") == ExampleWeighting(1.0, 1.0)
        assert divisor(version, 200, 30, 30, loss_reduction="sum") == 1.0
    assert example_weighting("0.9.0", 30) == ExampleWeighting(1.0, 1.0)
    with pytest.raises(ValueError, match="loss_reduction"):
        example_weighting("1.6.0", 30, loss_reduction="none")


def test_committed_real_code_audits_exceed_what_opacus_reports() -> None:
    """The audits of ``make probe-versions`` (real optimizers of 1.0.0, 1.6.0 and 0.15.0):
    the lower bound exceeds the epsilon the release prints and stays below the exact epsilon
    of the audited configuration; the printed epsilon is the version model's."""
    from opacus_lastiterate.analysis.normalisation import feasgm_verdict

    data = json.loads((PROBES.parent / "opacus_audits.json").read_text())
    assert data["command"].startswith("python scripts/probe_opacus_versions.py")
    mechanisms = {}
    for a in data["audits"]:
        cfg = a["config"]
        n = cfg["dataset_size_with_canary"]
        rel = release(a["opacus"])
        assert a["audit"]["kind"] == "bound" and a["audit"]["confidence"] == 0.95
        assert float(a["eps_reported"]) < a["eps_audit_lower_bound"] <= float(a["eps_config"])
        batch = cfg.get("batch_size") or round(cfg["sample_rate"] * n)
        vc = VersionConfig(n, batch, cfg["noise_multiplier"], cfg["delta"], epochs=None, steps=cfg["steps"])
        tolerance = 0.02 if rel.default_accountant == "prv" else 1e-5 * a["eps_reported"]
        assert a["eps_reported"] == pytest.approx(reported_epsilon(rel, vc), abs=tolerance)
        if a["mechanism"] == "FEASGM":
            assert rel.family == "1.x" and cfg["divisors"][0] != cfg["divisors"][1]
            assert not feasgm_verdict(n, cfg["batch_size"]).safe and a["eps_corrected"] == "inf"
        else:
            assert rel.mechanism == "ASGM" and rel.poisson_sampler
            assert a["eps_audit_lower_bound"] <= float(a["eps_corrected"]) < math.inf
        mechanisms[a["mechanism"]] = rel.family
    assert mechanisms["FEASGM"] == "1.x" and mechanisms["ASGM"].startswith("0.")
