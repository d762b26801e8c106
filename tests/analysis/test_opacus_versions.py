"""The Opacus version model: the 26 releases, the exact 1.x divisor, each version's own
epsilon, and a probe of the installed Opacus's real optimizer (divisor and noise scale)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.normalisation import opacus1x_batch_arithmetic
from opacus_lastiterate.analysis.opacus_versions import (
    OPACUS_RELEASES,
    VersionConfig,
    compare_versions,
    corrected_epsilon,
    divisor,
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


def _probe(sigma: float, n: int = 200, b: int = 30, steps: int = 6) -> list[tuple[int, np.ndarray]]:
    """Real Opacus optimizer, one-hot data: each per-example gradient is e_i (norm 1)."""
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = torch.nn.Linear(n, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    model, opt, loader = PrivacyEngine().make_private(
        module=model, optimizer=opt,
        data_loader=DataLoader(TensorDataset(torch.eye(n), torch.zeros(n)), batch_size=b),
        noise_multiplier=sigma, max_grad_norm=1e6 if sigma == 0 else 1.0,
    )
    out = []
    for i, (x, _) in enumerate(loader):
        if i == steps:
            break
        opt.zero_grad()
        model(x).mean().backward()
        opt.step()
        out.append((len(x), model._module.weight.grad.detach().double().flatten().numpy().copy()))
    return out


def test_probe_of_installed_opacus_agrees_with_the_model() -> None:
    pytest.importorskip("opacus")
    rel = installed_release()
    assert rel is not None
    n, b = 200, 30
    expected = divisor(rel, n, b)  # 28
    for size, grad in _probe(0.0):  # noise off: the update is indicator(batch) / divisor
        nz = grad[grad != 0]
        assert len(nz) == size
        if size:
            assert 1 / nz.mean() == pytest.approx(expected, rel=1e-6)
    # noise on, C = 1: grad = (sum + N(0, sigma^2 I)) / c; off-batch coordinates are pure noise
    sigma = 2.0
    samples = np.concatenate([g for _, g in _probe(sigma)]) * expected
    k = samples.size  # about 1200; std estimate has relative s.e. 1/sqrt(2k)
    tolerance = 5 / math.sqrt(2 * k)
    assert samples.std() == pytest.approx(sigma * 1.0, rel=tolerance)


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
