"""Epsilons computed independently of the accountants and the monitor, for the mode tests:
the heuristic from ``analysis.last_iterate.heuristic`` at (q, sigma, t), its robust maximum
as the brute-force max over t' <= t, the standard PLD epsilon from dp_accounting's
``PLDAccountant`` composed here, and the RDP bound from Opacus's own ``RDPAccountant``."""

from __future__ import annotations

import functools

import pytest

DELTA = 1e-5


@functools.cache
def _heuristic(t: int, q: float, sigma: float) -> float:
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.analysis.run import DPSGDRun

    return float(privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(DELTA))


@functools.cache
def _pld(t: int, q: float, sigma: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), t)
    return float(acc.get_epsilon(DELTA))


@functools.cache
def _rdp(t: int, q: float, sigma: float) -> float:
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(sigma, q, t)]
    return float(acc.get_epsilon(DELTA))


def check_records(records: list[dict], q: float, sigma: float, *, corrected: bool) -> None:
    """Every logged epsilon of every step against the independent computations."""
    steps = [r["step"] for r in records if not r["final"]]
    assert steps == list(range(1, len(steps) + 1))  # one record per logical step
    for r in records:
        t = r["step"]
        assert r["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
        assert r["sample_rate"] == pytest.approx(q, rel=1e-12)
        heuristic = _heuristic(t, q, sigma)
        assert r["heuristic_epsilon"] == pytest.approx(heuristic, rel=1e-6)
        robust = max(_heuristic(s, q, sigma) for s in range(1, t + 1))
        assert r["robust_heuristic_epsilon"] == pytest.approx(robust, rel=1e-6)
        pld = _pld(t, q, sigma)
        assert r["standard_epsilon"] == pytest.approx(pld, rel=1e-9)
        assert r["opacus_rdp_epsilon"] == pytest.approx(_rdp(t, q, sigma), rel=1e-9)
        if corrected:
            assert r["corrected_epsilon"] == pytest.approx(pld, rel=1e-9)


def monitor_factory(engine, optimizer, extra):
    """A PrivacyMonitor with every value at every step, its records collected in a list
    (the probes' ``monitor`` argument)."""
    from opacus_lastiterate.callbacks import PrivacyMonitor

    records: list = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=optimizer, robust_every=1,
        standard_every=1, weighted_every=None, flush_every=None, **extra,
    )
    return monitor, records
