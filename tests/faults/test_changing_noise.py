"""Fault injection: a noise multiplier that changes at every step (Opacus's ``ExponentialNoise``).
The monitor's final standard value is composed with a bounded work (at most ``max_groups``
one-step PLDs, 128 by default, on grids of at most 8,192 points for the least private one,
whatever the number of distinct noise multipliers) and stays an upper bound: at least the
composition of every step's own PLD (``compose_subsampled_gaussian``, which equals
dp_accounting's ``PLDAccountant`` to 1e-6 relative, ``test_pld_composition``; at a 1e-3
interval, whose pessimistic discretisation raises it by about 1e-4 relative, hence the
tolerance) and at most that composition with every noise multiplier lowered by the grouping
factor the model reports."""

from __future__ import annotations

from opacus.schedulers import ExponentialNoise

from opacus_lastiterate.analysis.baselines import pld_composition
from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyMonitor
from tests._pmf_builds import record_pmf_builds
from tests.callbacks.conftest import DELTA, make_dp, train

STEPS, GAMMA = 150, 0.995


def _every_step(history: list[tuple[float, float, int]]) -> float:
    return pld_composition.compose_subsampled_gaussian(history, 1e-3).get_epsilon_for_delta(DELTA)


def test_noise_changing_at_every_step_gets_a_bounded_upper_bound_at_finish(monkeypatch) -> None:
    engine, model, opt, loader = make_dp(sigma=1.5)
    noise = ExponentialNoise(opt, gamma=GAMMA)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt,
        robust_every=None, standard_every=None,
    )  # fmt: skip
    train(model, opt, loader, STEPS, after=lambda _: noise.step())
    built = record_pmf_builds(monkeypatch)
    pld_composition.clear_kept_compositions()
    final = monitor.finish()
    history = [(float(s), float(q), int(n)) for s, q, n in engine.accountant.history]
    assert len({s for s, _, _ in history}) == STEPS  # one noise multiplier per step
    assert final is not None and final.step == STEPS and final.standard_epsilon is not None
    # the monitor asks the default model: at most 128 one-step PLDs for 150 distinct sigmas,
    # none wider than 8,192 points
    assert len(built) <= 128 < STEPS
    assert max(pmfs[0].probs.size for _, pmfs in built) <= 8192 + 2
    monkeypatch.undo()
    assert final.standard_epsilon >= _every_step(history) * (1 - 1e-3)
    _, grouping, _ = StandardComposition(history).settings
    worse = _every_step([(s / (1 + grouping), q, n) for s, q, n in history])
    assert final.standard_epsilon <= worse * (1 + 1e-3)
