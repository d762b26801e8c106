"""The release table's training modes: DDP/FSDP divisors and adaptive-clipping epsilons.

Independent references: the divisors worked out by hand from Opacus's source
(``expected_batch_size = int(N / len(loader))``, divided by W from 1.0.2), the noise
multipliers from Theorem 1 of Andrew et al. by hand, and the epsilons from Opacus's own
``PRVAccountant`` / ``RDPAccountant`` (the installed release) at those multipliers.
"""

from __future__ import annotations

import math

import pytest

from opacus_lastiterate.analysis.opacus_modes import adaclip_accounting, distributed_divisors
from opacus_lastiterate.analysis.opacus_releases import OPACUS_RELEASES, release
from opacus_lastiterate.analysis.opacus_versions import VersionConfig

# N = 200, L = 30: len(loader) = 7, q = 1/7, int(200 / 7) = 28 (the probe's 1.x setting)
CONFIG = VersionConfig(10000, 100, 1.1, 1e-5, epochs=None, steps=1000)  # q = 0.01


def test_distributed_divisors_per_rank_and_global() -> None:
    assert distributed_divisors("1.0.0", 200, 30, 2) == (28.0, 56.0)  # the 1.0.0 DDP bug
    assert distributed_divisors("1.0.1", 200, 30, 2) == (28.0, 56.0)
    for v in ("1.0.2", "1.5.4", "1.6.0"):
        assert distributed_divisors(v, 200, 30, 2) == (14.0, 28.0)
        assert distributed_divisors(v, 200, 30, 4) == (7.0, 28.0)
    with pytest.raises(ValueError, match="0.x"):
        distributed_divisors("0.15.0", 200, 30, 2)
    with pytest.raises(ValueError, match="world_size"):
        distributed_divisors("1.6.0", 200, 30, 0)


def test_mode_texts_by_release() -> None:
    have = {r.version for r in OPACUS_RELEASES if r.adaptive_clipping}
    assert min(have, key=lambda v: release(v).key) == "1.1.3"
    ghost = {r.version for r in OPACUS_RELEASES if r.ghost_clipping}
    assert ghost == {"1.5", "1.5.1", "1.5.2", "1.5.3", "1.5.4", "1.6.0"}
    assert "FSDP" in release("1.6.0").distributed and "FSDP" not in release("1.5.4").distributed
    assert "#807" in release("1.5.4").adaptive_clipping and "too" in release("1.5.4").adaptive_clipping
    assert "records sigma" in release("1.6.0").adaptive_clipping


def _printed(accountant: str, sigma: float) -> float:
    accountants = pytest.importorskip("opacus.accountants")
    cls = {"prv": accountants.PRVAccountant, "rdp": accountants.RDPAccountant}[accountant]
    acc = cls()
    acc.history = [(sigma, 0.01, 1000)]
    return float(acc.get_epsilon(1e-5))


def test_adaclip_before_and_after_807() -> None:
    sigma, sigma_u = 1.1, 1.0
    sigma_eff = 1 / math.sqrt(1 / sigma**2 - 1 / (2 * sigma_u) ** 2)  # 1.3171
    old = adaclip_accounting("1.5.4", CONFIG, sigma_u)
    assert old.recorded_noise_multiplier == pytest.approx(sigma_eff, rel=1e-12)
    assert old.accounted_noise_multiplier == sigma
    assert old.reported == pytest.approx(_printed("prv", sigma_eff), abs=1e-6)  # 1.1256
    assert old.corrected == pytest.approx(_printed("prv", sigma), abs=1e-6)  # 1.5255
    assert old.reported < old.corrected
    new = adaclip_accounting("1.6.0", CONFIG, sigma_u)
    assert new.recorded_noise_multiplier == sigma and new.reported == new.corrected
    rdp = adaclip_accounting("1.2.0", CONFIG, sigma_u)  # RDP default before 1.3.0
    assert rdp.reported == pytest.approx(_printed("rdp", sigma_eff), rel=1e-6)
    assert rdp.corrected == pytest.approx(_printed("rdp", sigma), rel=1e-6)
    # the count with add/remove sensitivity 1: 1/s^2 = 1/sigma^2 + 3 / (4 sigma_u^2)
    one = 1 / math.sqrt(1 / sigma**2 + 3 / (4 * sigma_u**2))
    assert new.count_sensitivity_one_noise_multiplier == pytest.approx(one, rel=1e-12)
    assert new.count_sensitivity_one > new.corrected


def test_adaclip_rejects_what_opacus_rejects() -> None:
    with pytest.raises(ValueError, match="1.1.3"):
        adaclip_accounting("1.1.2", CONFIG, 1.0)
    with pytest.raises(ValueError, match="2 \\* unclipped_num_std"):
        adaclip_accounting("1.6.0", CONFIG, 0.5)
    with pytest.raises(ValueError, match="unclipped_num_std"):
        adaclip_accounting("1.6.0", CONFIG, -1.0)


def test_committed_mode_probes_agree_with_the_table() -> None:
    """``docs/results/opacus_mode_probes.json`` (real 1.5.4 and 1.6.0 code, N = 58, L = 12:
    q = 1/5, int(N q) = 11): the divisors and histories by hand, and the adaptive-clipping
    history as each release's row says (sigma_eff before 1.6.0, sigma from 1.6.0)."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "results" / "opacus_mode_probes.json"
    data = json.loads(path.read_text())
    assert not any(root in data["command"] for root in ("/" + "work", "/" + "home"))
    sigma_eff = (1.0 - 1 / 16) ** -0.5  # sigma = 1, sigma_u = 2
    for rec in data["records"]:
        rel = release(rec["opacus"])
        assert not rec["failed"]
        modes = rec["modes"]
        for mode in ("hooks", "ghost", "ghost_bmm", "ghost_accumulation", "bmm"):
            assert modes[mode]["history"] == [[0.0, 0.2, 3]]
            assert modes[mode]["divisors"] == pytest.approx([11.0] * 3, rel=1e-5)
        assert modes["ghost_accumulation"]["released_batches"] == ["last"] * 3
        assert modes["accumulation"]["history"] == [[0.0, 0.4, 3]]
        assert modes["accumulation"]["divisors"] == pytest.approx([22.0] * 3, rel=1e-5)
        recorded = modes["adaclip"]["history"][0][0]
        expected = 1.0 if "PR #807)" in rel.adaptive_clipping and "fixed" not in rel.adaptive_clipping else sigma_eff
        assert recorded == pytest.approx(expected, rel=1e-12)
