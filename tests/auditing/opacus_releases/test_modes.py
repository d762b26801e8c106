"""Opacus's training modes through ``PrivacyEngine``: ghost clipping (with and without
gradient accumulation, with ``BatchMemoryManager``), virtual steps and manual accumulation,
and adaptive clipping; each checked for its step count, its divisor and every epsilon the
monitor logged, against independent computations:

* the divisor: the released gradient against the gradient of the summed per-sample losses
  of a plain copy of the model (``auditing/opacus_releases/modes.py``), expected to be
  Opacus 1.x's int(N / len(loader)) (times k for plain accumulation), worked out by hand;
* the steps and sample rates: one noisy step per logical batch at q = 1 / len(DPDataLoader)
  (k / len(loader) for plain accumulation), by hand;
* the epsilons: the heuristic from ``analysis.last_iterate.heuristic`` at (q, sigma, t), its
  robust maximum as the brute-force max over t' <= t, the standard PLD epsilon from
  dp_accounting's ``PLDAccountant`` composed here, the RDP bound from Opacus's own
  ``RDPAccountant``, and the corrected (FEASGM with a public divisor) epsilon as the same
  PLD epsilon (the verdict is safe, so it is SGM's).

Data: N = 58, L = 12, so len(DPDataLoader) = ceil(58 / 12) = 5, q = 0.2 and int(N q) = 11
(ceil((N +- 1) / 12) = 5 too, so with a public divisor the FEASGM verdict is safe).
"""

from __future__ import annotations

import math
import warnings

import pytest

pytest.importorskip("opacus")

from opacus_lastiterate.analysis.opacus_releases import installed_release
from opacus_lastiterate.auditing.opacus_releases.modes import (
    ADACLIP_DEFAULTS,
    MODE_SINCE,
    probe_mode,
)
from tests.auditing.opacus_releases._independent import check_records, monitor_factory

N, L, SIGMA = 58, 12, 1.0
Q, EBS = 1 / 5, 11.0
REL = installed_release()
SLOW = pytest.mark.slow


def _available(mode: str) -> bool:
    return REL is not None and REL.key >= MODE_SINCE[mode]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _public_feasgm(engine, optimizer):
    """FEASGM accountant beside the monitor, with the divisor made public (safe verdict)."""
    from opacus_lastiterate.accountants import FEASGMAccountant, use_public_divisor

    use_public_divisor(optimizer, expected_batch_size=L)
    acc = FEASGMAccountant().configure(dataset_size=N, batch_size=L)
    return {"corrected_accountant": acc}


# -- the modes ---------------------------------------------------------------------------

CASES = [
    # mode, model, physical steps per logical step (or None: varies), divisor, q, released
    ("ghost", "mlp", 1, EBS, Q, "all"),
    ("ghost", "transformer", 1, EBS, Q, "all"),
    ("ghost_bmm", "mlp", None, EBS, Q, "all"),
    ("ghost_accumulation", "mlp", 1, EBS, Q, "last"),
    pytest.param("ghost_accumulation", "transformer", 1, EBS, Q, "last", marks=SLOW),
    ("bmm", "mlp", None, EBS, Q, "all"),
    pytest.param("bmm", "transformer", None, EBS, Q, "all", marks=SLOW),
    ("accumulation", "mlp", 1, 2 * EBS, 2 * Q, "all"),
]


@pytest.mark.parametrize(("mode", "model", "per_step", "divisor", "q", "released"), CASES)
def test_mode_steps_and_divisor(mode, model, per_step, divisor, q, released) -> None:
    if not _available(mode):
        pytest.skip(f"{mode} needs Opacus >= {MODE_SINCE[mode]}")
    obs = probe_mode(mode, model=model, dataset_size=N, batch_size=L, logical_steps=3,
                     )
    assert obs.logical_steps == 3
    assert obs.history == [(0.0, q, 3)]
    assert obs.expected_batch_size == EBS
    assert obs.released_batches == [released] * 3
    assert obs.divisors == pytest.approx([divisor] * 3, rel=1e-5)  # float32 gradients
    if per_step is not None:
        assert obs.physical_steps == 3 * per_step
    else:  # virtual steps: one physical step per chunk of <= 5 records
        assert obs.physical_steps == sum(obs.batches_per_step)
        assert all(b == max(1, math.ceil(r / 5)) for b, r in
                   zip(obs.batches_per_step, obs.records_per_step))
        assert obs.physical_steps > obs.logical_steps


def test_ghost_accumulation_releases_only_the_last_micro_batch() -> None:
    """Opacus #683 as it runs: k backward passes then one step. ``DPTensorFastGradientClipping.
    backward`` calls ``optimizer.zero_grad()`` between its two passes, so each backward wipes
    the previous micro-batch's clipped gradient: the update is (S_last + Z) / int(N q),
    one Poisson batch per noisy step, which is exactly what the accountant records (q per
    step). The earlier micro-batches are discarded (a utility bug, not a privacy one)."""
    if not _available("ghost_accumulation"):
        pytest.skip("ghost clipping needs Opacus >= 1.5")
    obs = probe_mode("ghost_accumulation", accumulation=3, dataset_size=N, batch_size=L,
                     logical_steps=2)
    assert obs.batches_per_step == [3, 3]
    assert obs.released_batches == ["last", "last"]
    assert obs.history == [(0.0, Q, 2)]
    assert obs.divisors == pytest.approx([EBS, EBS], rel=1e-5)


EPSILON_CASES = [  # about 15 s each on one core: one in the default suite
    ("ghost", "mlp", Q),
    pytest.param("ghost", "transformer", Q, marks=SLOW),
    pytest.param("ghost_bmm", "transformer", Q, marks=SLOW),
    pytest.param("ghost_accumulation", "mlp", Q, marks=SLOW),
    pytest.param("bmm", "mlp", Q, marks=SLOW),
    pytest.param("accumulation", "mlp", 2 * Q, marks=SLOW),
]


@pytest.mark.parametrize(("mode", "model", "q"), EPSILON_CASES)
def test_mode_logged_epsilons(mode, model, q) -> None:
    if not _available(mode):
        pytest.skip(f"{mode} needs Opacus >= {MODE_SINCE[mode]}")
    obs = probe_mode(mode, model=model, noise_multiplier=SIGMA, max_grad_norm=1.0,
                     dataset_size=N, batch_size=L, logical_steps=3, prepare=_public_feasgm,
                     monitor=monitor_factory)
    assert obs.history == [(SIGMA, q, 3)]
    assert len([r for r in obs.records if not r["final"]]) == 3  # logical, not physical
    # plain accumulation: FEASGM's verdict models accumulation-free Poisson runs (it warns)
    check_records(obs.records, q, SIGMA, corrected=mode != "accumulation")


@pytest.mark.parametrize(
    "accountant",
    ["last_iterate", *(pytest.param(a, marks=SLOW) for a in ("feasgm", "asgm", "prv"))],
)
def test_every_accountant_counts_one_step_per_logical_batch(accountant) -> None:
    if not _available("ghost_bmm"):
        pytest.skip("ghost clipping needs Opacus >= 1.5")

    def prepare(engine, optimizer):
        if accountant in ("feasgm", "asgm"):
            engine.accountant.configure(dataset_size=N, batch_size=L)
        return None

    obs = probe_mode("ghost_bmm", accountant=accountant, noise_multiplier=SIGMA,
                     max_grad_norm=1.0, dataset_size=N, batch_size=L, logical_steps=3,
                     prepare=prepare)
    assert obs.physical_steps > 3
    assert obs.history == [(SIGMA, Q, 3)]


@pytest.mark.parametrize("monitored", [False, pytest.param(True, marks=SLOW)])
def test_adaclip_accounts_the_theorem_1_noise_multiplier(monitored: bool) -> None:
    """Adaptive clipping adds sigma_eff = (sigma^-2 - (2 sigma_u)^-2)^(-1/2) to the gradients
    (measured from the noise itself) and every release's accountant here records sigma
    (Opacus 1.6.0's accounting, PR #807), also on 1.1.3-1.5.4 where Opacus records sigma_eff."""
    if not _available("adaclip"):
        pytest.skip("adaptive clipping needs Opacus >= 1.1.3")
    sigma_u = ADACLIP_DEFAULTS["unclipped_num_std"]
    sigma_eff = (SIGMA**-2 - (2 * sigma_u) ** -2) ** -0.5
    obs = probe_mode("adaclip", noise_multiplier=SIGMA, max_grad_norm=1.0, dataset_size=N,
                     batch_size=L, logical_steps=3, monitor=monitor_factory if monitored else None)
    assert obs.history == [(pytest.approx(SIGMA, rel=1e-12), Q, 3)]
    # 400 noise coordinates per step: the std of the std estimate is sigma_eff / sqrt(800)
    for applied in obs.noise_multipliers_applied:
        assert applied == pytest.approx(sigma_eff, abs=5 * sigma_eff / math.sqrt(800))
    if monitored:
        check_records(obs.records, Q, SIGMA, corrected=False)


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(), reason="needs CUDA (scripts/gpu_checks.sh)"
)
@pytest.mark.parametrize("mode", ["ghost", "ghost_bmm", "ghost_accumulation", "bmm"])
def test_modes_on_cuda(mode: str) -> None:
    """The same steps and divisors with the model and the batches on the GPU."""
    if not _available(mode):
        pytest.skip(f"{mode} needs Opacus >= {MODE_SINCE[mode]}")
    obs = probe_mode(mode, model="transformer", dataset_size=N, batch_size=L,
                     logical_steps=3, device="cuda")
    assert obs.history == [(0.0, Q, 3)]
    assert obs.divisors == pytest.approx([EBS] * 3, rel=1e-4)
    assert obs.released_batches == ["last" if mode == "ghost_accumulation" else "all"] * 3


def _light_monitor(engine, optimizer, extra):
    from opacus_lastiterate.callbacks import PrivacyMonitor

    records: list = []
    monitor = PrivacyMonitor(
        engine, delta=1e-5, sinks=[records.append], optimizer=optimizer, robust_every=None,
        standard_every=None, weighted_every=None, flush_every=None,
    )
    return monitor, records


@pytest.mark.parametrize("mode", ["bmm", "ghost_bmm"])
def test_monitor_logs_logical_steps_with_the_physical_count(mode: str) -> None:
    """One record per noisy (logical) step; ``physical_steps`` beside it counts the
    ``optimizer.step()`` calls of BatchMemoryManager's chunks up to that step."""
    if not _available(mode):
        pytest.skip(f"{mode} needs Opacus >= {MODE_SINCE[mode]}")
    obs = probe_mode(mode, noise_multiplier=SIGMA, max_grad_norm=1.0, dataset_size=N,
                     batch_size=L, logical_steps=3, monitor=_light_monitor)
    steps = [r for r in obs.records if not r["final"]]
    assert [r["step"] for r in steps] == [1, 2, 3]
    cumulative = [sum(obs.batches_per_step[: i + 1]) for i in range(3)]
    assert [r["physical_steps"] for r in steps] == cumulative
    assert cumulative[-1] == obs.physical_steps > 3
    assert obs.records[-1]["final"] and obs.records[-1]["physical_steps"] == obs.physical_steps
