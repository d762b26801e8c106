"""The Opacus version model: the 26 releases, the exact 1.x divisor, each version's own
epsilon, and agreement with the committed real-code probes of every release (the probe of
the installed Opacus runs in ``tests/auditing/opacus_releases/test_probe.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic
from opacus_lastiterate.analysis.opacus_releases import installed_version
from opacus_lastiterate.analysis.opacus_versions import (
    OPACUS_RELEASES,
    ExampleWeighting,
    VersionConfig,
    compare_versions,
    corrected_epsilon,
    divisor,
    example_weighting,
    installed_release,
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
    from importlib import metadata, util

    if util.find_spec("opacus") is None:  # the light install
        pytest.skip("opacus is not installed")

    assert installed_version() == metadata.version("opacus")
    rel = installed_release()
    assert rel is not None and rel.key == release(metadata.version("opacus")).key


# Opacus's PRV accountant (opacus.accountants.analysis.prv, Gopi, Lee, Wutschitz 2021) returns
# eps_upper = eps(delta - delta_error) + eps_error, with the true epsilon in
# [eps(delta + delta_error) - eps_error, eps_upper] (delta_error = delta / 1000 moves eps(.)
# by far less than 1e-3 here). The package's PRV stand-in is a PLD upper bound on the same
# epsilon, so it lies in [eps_upper - 2 eps_error - 1e-3, eps_upper]. Here eps_error = 1e-3
# (Opacus's default, 0.01, is what a release prints).
PRV_ERROR = 0.001
# Opacus's RDP of the subsampled Gaussian and dp_accounting's differ by about 1e-7 relative at
# fractional orders (measured 1.1e-7).
RDP_REL = 1e-6


def _prv_upper(q: float, sigma: float, steps: int, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    return prv.get_epsilon(delta, eps_error=PRV_ERROR)


def _in_prv_bracket(value: float, upper: float, eps_error: float = PRV_ERROR) -> bool:
    return upper - 2 * eps_error - 1e-3 <= value <= upper


def _prv_printed(q: float, sigma: float, steps: int, delta: float) -> float:
    """What Opacus's PRVAccountant prints (its defaults: eps_error 0.01, delta_error delta/1000)."""
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    return float(prv.get_epsilon(delta))


def test_reported_epsilon_reproduces_each_conversion() -> None:
    """Each release's conversion against Opacus's own code (1.6.0 installed): the RDP of
    opacus.accountants.analysis.rdp.compute_rdp at RDPAccountant.DEFAULT_ALPHAS, converted
    with the classic rule min_a rdp_a + log(1 / delta) / (a - 1) (0.9-0.13) or Opacus's
    improved get_privacy_spent (0.14-1.2); PRV (1.3+) what Opacus's PRVAccountant prints."""
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    # q = 0.01, sigma = 1.1, 1000 steps, delta = 1e-5 (N = 10000, L = 100)
    cfg = VersionConfig(10_000, 100, 1.1, 1e-5, epochs=None, steps=1000)
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = compute_rdp(q=0.01, noise_multiplier=1.1, steps=1000, orders=orders)
    classic = min(r + math.log(1 / 1e-5) / (a - 1) for a, r in zip(orders, rdp, strict=True))
    improved, _ = get_privacy_spent(orders=orders, rdp=rdp, delta=1e-5)
    assert improved < classic
    assert reported_epsilon("0.13.0", cfg) == pytest.approx(classic, rel=RDP_REL)
    assert reported_epsilon("1.2.0", cfg) == pytest.approx(improved, rel=RDP_REL)
    assert reported_epsilon("1.6.0", cfg) == pytest.approx(
        _prv_printed(0.01, 1.1, 1000, 1e-5), abs=1e-6
    )


def test_reported_matches_installed_opacus_accountants() -> None:
    pytest.importorskip("opacus")
    import torch
    from opacus.accountants import RDPAccountant
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    cfg = VersionConfig(9300, 100, 1.0, 1e-5, epochs=2)
    # what make_private does: the accountant's q is 1 / len(the Poisson loader), and an epoch
    # is len(the Poisson loader) steps
    loader = DPDataLoader.from_data_loader(
        DataLoader(TensorDataset(torch.zeros(9300, 1)), batch_size=100)
    )
    q, steps = 1 / len(loader), 2 * len(loader)
    rdp = RDPAccountant()
    rdp.history = [(1.0, q, steps)]
    assert reported_epsilon("1.2.0", cfg) == pytest.approx(rdp.get_epsilon(1e-5), rel=RDP_REL)
    assert reported_epsilon("1.6.0", cfg) == pytest.approx(
        _prv_printed(q, 1.0, steps, 1e-5), abs=1e-6
    )


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
    # the divisor is the same for N - 1, N, N + 1, so the corrected epsilon is the SGM's at
    # the sample rate of Opacus's Poisson loader, one epoch of len(loader) steps (by
    # Opacus's PRV accountant)
    pytest.importorskip("opacus")  # the rest needs torch and Opacus (not in the light install)
    import torch
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    safe = VersionConfig(60000, 256, 1.1, 1e-5, epochs=1)
    eps, model = corrected_epsilon("1.6.0", safe)
    assert "safe" in model
    loader = DPDataLoader.from_data_loader(
        DataLoader(TensorDataset(torch.zeros(60000, 1)), batch_size=256)
    )
    assert _in_prv_bracket(eps, _prv_upper(loader.sample_rate, 1.1, len(loader), 1e-5))


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
    from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict

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
        if rel.default_accountant == "prv":  # the release's own PRV arithmetic, re-run
            assert reported_epsilon(rel, vc) == pytest.approx(a["eps_reported"], abs=1e-6)
        else:
            assert a["eps_reported"] == pytest.approx(reported_epsilon(rel, vc), rel=1e-5)
        if a["mechanism"] == "FEASGM":
            assert rel.family == "1.x" and cfg["divisors"][0] != cfg["divisors"][1]
            assert not feasgm_verdict(n, cfg["batch_size"]).safe and a["eps_corrected"] == "inf"
        else:
            assert rel.mechanism == "ASGM" and rel.poisson_sampler
            assert a["eps_audit_lower_bound"] <= float(a["eps_corrected"]) < math.inf
        mechanisms[a["mechanism"]] = rel.family
    assert mechanisms["FEASGM"] == "1.x" and mechanisms["ASGM"].startswith("0.")
