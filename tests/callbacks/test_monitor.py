"""PrivacyMonitor: the values it records are the accountant's, on their cadences; the
budget guard refuses exactly the first step over the limit; no tensor is read per step."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import warnings
from typing import Any

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant

import opacus_lastiterate.callbacks.cadence as cadence_module
from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.incremental_rdp import IncrementalRDP
from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.callbacks import (
    EpsilonRecord,
    PrivacyBudget,
    PrivacyBudgetExceededError,
    PrivacyMonitor,
)
from opacus_lastiterate.callbacks.cadence import DOUBLING_START
from opacus_lastiterate.callbacks.cadence import due as _due
from opacus_lastiterate.callbacks.records import FIELDS
from tests.analysis._reference import (
    QuadratureHeuristic,
    torch_sgd_weights,
    weighted_heuristic_quadrature,
)
from tests.callbacks.conftest import DELTA, DEVICES, make_dp, train

# Queued steps of one setting are solved together (IncrementalHeuristic.advance): their
# epsilons equal the accountant's step-by-step values to the root finder's tolerance
# (about 1e-13 relative), not bit for bit.
BATCHED = 1e-12


def test_records_equal_the_accountant_at_every_step() -> None:
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    expected: list[tuple[int, float, float]] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], robust_every=3, standard_every=4,
        flush_every=None,
    )
    monitor.attach(opt)

    def check(step: int) -> None:
        acc = engine.accountant
        expected.append((acc.num_steps, acc.get_epsilon(DELTA), acc.get_epsilon(DELTA, robust=True)))

    train(model, opt, loader, 8, after=check)
    assert records == [] and monitor.pending == 8  # recorded, not yet evaluated
    monitor.flush()
    assert [r.step for r in records] == list(range(1, 9)) and monitor.pending == 0
    for r, (steps, heuristic, robust) in zip(records, expected, strict=True):
        assert r.step == steps
        assert r.heuristic_epsilon == pytest.approx(heuristic, rel=BATCHED)
        assert (r.robust_heuristic_epsilon is not None) == (r.step % 3 == 0)
        if r.robust_heuristic_epsilon is not None:
            assert r.robust_heuristic_epsilon == pytest.approx(robust, rel=1e-12)
        assert (r.standard_epsilon is not None) == (r.step % 4 == 0)
        assert r.lr == 0.1 and r.noise_multiplier == 1.0 and r.sample_rate == 1 / 8
        assert r.corrected_epsilon is None and not r.final
    # the RDP bound equals Opacus's RDP accountant; the PLD value is the tight one below it
    rdp = RDPAccountant()
    rdp.history = [(1.0, 1 / 8, 8)]
    assert records[-1].opacus_rdp_epsilon == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-9)
    pld = StandardComposition([(1.0, 1 / 8, 8)]).epsilon(DELTA)
    assert records[7].standard_epsilon == pytest.approx(pld, rel=1e-12)
    assert pld < records[-1].opacus_rdp_epsilon
    final = monitor.finish()
    assert final is not None and final.final and final.step == 8
    assert final.robust_heuristic_epsilon is not None and final.standard_epsilon is not None
    assert monitor.records_emitted == 9


def test_finish_twice_emits_one_final_record(tmp_path) -> None:
    """An adapter finishes the monitor at the end of training; the user's own finish() must
    return the same record, not write to the closed sinks."""
    from opacus_lastiterate.callbacks import JsonlSink

    engine, model, opt, loader = make_dp()
    log = tmp_path / "privacy.jsonl"
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[JsonlSink(log)])
    monitor.attach(opt)
    train(model, opt, loader, 3)
    first = monitor.finish()
    again = monitor.finish()
    assert first is not None and again == first
    lines = log.read_text().splitlines()
    # one row per step: the final record replaced step 3's row
    assert len(lines) == 3 and sum('"final": true' in line for line in lines) == 1
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


# The weighted heuristic is an upper bound within the accountant's weight_accuracy (1e-3
# relative, docs/last_iterate.md) of the exact weighted value; the quadrature reference is
# accurate to about 1e-11 relative.
WEIGHT_ACCURACY = 1e-3
QUADRATURE = 1e-9


@functools.lru_cache(maxsize=8)
def _independent_heuristics(lrs: tuple[float, ...], momentum: float) -> tuple[float, float]:
    """(weighted, constant-rate) heuristic epsilon at DELTA after len(lrs) steps of the
    conftest run (q = 1/8, sigma = 1), computed without the package: the weights by running
    torch's SGD on one scalar, the pair by 2^T enumeration, the epsilon by quadrature."""
    weights = torch_sgd_weights(lrs, momentum)
    weighted = weighted_heuristic_quadrature(weights, 1 / 8, 1.0, DELTA)
    constant = QuadratureHeuristic(len(lrs), 1 / 8, 1.0).epsilon(DELTA)
    return weighted, constant


BATCH_AGREEMENT = 1e-7
"""The weighted heuristic of a flushed batch (its steps solved together) against the
accountant asked at each step: two certified upper bounds whose root refinements stop at
about 1e-8 relative (fourier_roots), from the same characteristic function up to its
certified error."""


def _check_weighted(logged: float, lrs: list[float], momentum: float) -> None:
    weighted, constant = _independent_heuristics(tuple(lrs), momentum)
    assert weighted * (1 - QUADRATURE) <= logged <= weighted * (1 + WEIGHT_ACCURACY), (
        len(lrs), logged, weighted, constant,
    )
    if len(lrs) >= 4:  # here the two differ by 1.4-6.9 %, far outside the accuracy band
        assert abs(constant - weighted) > 10 * WEIGHT_ACCURACY * weighted
        assert not constant * (1 - QUADRATURE) <= logged <= constant * (1 + WEIGHT_ACCURACY)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_momentum_and_schedule_use_the_weighted_value() -> None:
    """Momentum 0.9 and a cosine schedule: every logged heuristic epsilon is the weighted
    heuristic of the run (checked against an independent enumeration + quadrature), not
    the constant-rate value, which differs from it by 1.4-6.9 % at steps 4-6."""
    engine, model, opt, loader = make_dp(momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    records: list[EpsilonRecord] = []
    PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, weighted_every=1,
        flush_every=1,
    )
    lrs: list[float] = []

    def after(step: int) -> None:
        asked = engine.accountant.get_epsilon(DELTA)
        assert records[-1].heuristic_epsilon == pytest.approx(asked, rel=BATCH_AGREEMENT)
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()

    train(model, opt, loader, 6, after=after)
    assert [r.lr for r in records] == lrs  # the learning rate the step used
    assert len(set(lrs)) == 6
    for r in records:
        assert r.heuristic_epsilon is not None
        _check_weighted(r.heuristic_epsilon, lrs[: r.step], 0.9)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
def test_weighted_cadence_equals_an_accountant_asked_at_those_steps() -> None:
    """weighted_every=3: heuristic at steps 3 and 6 only, each the value an accountant asked
    at those steps reports, and that value is the weighted heuristic of the run so far
    (independent enumeration + quadrature); the constant-rate steps of the same monitor
    are not affected."""
    engine, model, opt, loader = make_dp(momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, weighted_every=3,
        flush_every=None,
    )
    expected: dict[int, float] = {}
    lrs: list[float] = []

    def after(step: int) -> None:
        lrs.append(opt.param_groups[0]["lr"])
        if step % 3 == 0:
            expected[step] = engine.accountant.get_epsilon(DELTA)
        sched.step()

    train(model, opt, loader, 6, after=after)
    final = monitor.finish()
    got = {r.step: r.heuristic_epsilon for r in records[:-1] if r.heuristic_epsilon is not None}
    assert got == pytest.approx(expected, rel=BATCH_AGREEMENT) and len(expected) == 2
    assert final is not None
    assert final.heuristic_epsilon == pytest.approx(expected[6], rel=BATCH_AGREEMENT)
    for step, value in got.items():
        _check_weighted(value, lrs[:step], 0.9)


def test_hot_path_computes_no_epsilon(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a budget a step only queues (sigma, q, lr, settings): no accountant query and
    no RDP conversion until the flush, which then evaluates every step once."""
    calls = {"epsilon": 0, "rdp": 0}  # "epsilon": heuristic values computed, by either path
    replica_get = LastIterateAccountant.get_epsilon
    replica_many = LastIterateAccountant.replay_steps
    convert = IncrementalRDP.epsilons

    def get_epsilon(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["epsilon"] += 1
        return replica_get(self, *args, **kwargs)

    def replay_steps(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = replica_many(self, *args, **kwargs)
        calls["epsilon"] += 0 if out is None else out.size
        return out

    def epsilons(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["rdp"] += 1
        return convert(self, *args, **kwargs)

    monkeypatch.setattr(LastIterateAccountant, "get_epsilon", get_epsilon)
    monkeypatch.setattr(LastIterateAccountant, "replay_steps", replay_steps)
    monkeypatch.setattr(IncrementalRDP, "epsilons", epsilons)
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=4,
        robust_every=None, standard_every=None,
    )
    train(model, opt, loader, 3)
    assert calls == {"epsilon": 0, "rdp": 0} and records == []
    train(model, opt, loader, 1)  # the 4th step flushes: one batch
    assert calls == {"epsilon": 4, "rdp": 1} and [r.step for r in records] == [1, 2, 3, 4]
    train(model, opt, loader, 2)
    assert calls["epsilon"] == 4 and monitor.pending == 2


def test_corrected_accountant_is_fed_and_reported() -> None:
    from opacus_lastiterate.accountants import FEASGMAccountant

    engine, model, opt, loader = make_dp()
    corrected = FEASGMAccountant().configure(dataset_size=256, batch_size=32)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], corrected_accountant=corrected,
        standard_every=2, optimizer=opt, flush_every=None,
    )
    train(model, opt, loader, 4)
    expected = corrected.get_epsilon(DELTA)
    monitor.flush()
    assert corrected.history == engine.accountant.history
    assert [r.corrected_epsilon is not None for r in records] == [False, True, False, True]
    assert records[3].corrected_epsilon == expected
    two = FEASGMAccountant().configure(dataset_size=256, batch_size=32)
    two.history = [(1.0, 1 / 8, 2)]
    assert records[1].corrected_epsilon == pytest.approx(two.get_epsilon(DELTA), rel=1e-12)
    monitor.finish()


def test_other_accountants_give_standard_only() -> None:
    engine, model, opt, loader = make_dp(accountant="rdp")
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=1)
    train(model, opt, loader, 3)
    assert records[-1].heuristic_epsilon is None
    assert records[-1].opacus_rdp_epsilon == pytest.approx(engine.get_epsilon(DELTA), rel=1e-9)


# -- budget guard ------------------------------------------------------------------------------


def _epsilons(steps: int) -> list[float]:
    engine, model, opt, loader = make_dp()
    values: list[float] = []
    train(model, opt, loader, steps, after=lambda _: values.append(engine.get_epsilon(DELTA)))
    return values


@pytest.mark.parametrize("metric", ["heuristic_epsilon", "opacus_rdp_epsilon"])
def test_budget_raises_exactly_before_the_first_step_over_the_limit(metric: str) -> None:
    engine, model, opt, loader = make_dp()
    probe = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, sinks=[], flush_every=1)
    values: list[float] = []
    train(model, opt, loader, 6, after=lambda _: values.append(getattr(probe.last_record, metric)))
    limit = values[3]  # step 4 reaches the limit exactly: allowed; step 5 exceeds it
    engine, model, opt, loader = make_dp()
    monitor = PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt, budget=PrivacyBudget(limit, metric=metric)
    )
    train(model, opt, loader, 4)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PrivacyBudgetExceededError, match="step 5 would bring") as info:
        train(model, opt, loader, 1)
    assert info.value.step == 5 and info.value.value == pytest.approx(values[4])
    assert engine.accountant.num_steps == 4
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    monitor.flush()
    assert monitor.last_record is not None and monitor.last_record.step == 4
    assert getattr(monitor.last_record, metric) == pytest.approx(limit, rel=1e-12)
    assert _rdp_of(monitor).epsilon(DELTA) == pytest.approx(
        monitor.last_record.opacus_rdp_epsilon
    )


def _long_run_values(steps: int, metric: str) -> list[float]:
    engine, model, opt, loader = make_dp(sigma=2.0)
    probe = PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt, flush_every=1, robust_every=None, standard_every=None
    )
    values: list[float] = []
    train(model, opt, loader, steps, after=lambda _: values.append(getattr(probe.last_record, metric)))
    return values


@pytest.mark.parametrize("metric", ["heuristic_epsilon", "opacus_rdp_epsilon"])
def test_budget_guard_is_exact_while_skipping_most_evaluations(
    metric: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over 60 steps the certified bounds (RDP, shifted count) let most steps through
    without evaluating them, and the guard still refuses exactly the first step whose value
    exceeds the limit, as an every-step evaluation finds it."""
    values = _long_run_values(60, metric)
    first_over = 48  # the refused step: the first whose value exceeds the limit
    # just above the largest allowed value: a limit equal to it would leave the decision at
    # that step to the last bits of the root finder (values here grow by about 1% a step)
    limit = max(values[: first_over - 1]) * (1.0 + 1e-10)
    assert values[first_over - 1] > limit

    from opacus_lastiterate.callbacks.evaluator import InlineEvaluator

    exact = {"count": 0}
    evaluate = InlineEvaluator.evaluate

    def counted(self, queue, out=None, *, need=None):  # type: ignore[no-untyped-def]
        exact["count"] += need is not None
        return evaluate(self, queue, out, need=need)

    monkeypatch.setattr(InlineEvaluator, "evaluate", counted)
    engine, model, opt, loader = make_dp(sigma=2.0)
    monitor = PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt, robust_every=None, standard_every=None,
        budget=PrivacyBudget(limit, metric=metric),
    )
    with pytest.raises(PrivacyBudgetExceededError) as info:
        train(model, opt, loader, 60)
    assert info.value.step == first_over and engine.accountant.num_steps == first_over - 1
    assert info.value.value == pytest.approx(values[first_over - 1], rel=1e-12)
    assert exact["count"] < first_over / 2  # most steps were certified, not evaluated
    monitor.flush()
    assert monitor.last_record is not None and monitor.last_record.step == first_over - 1


def _rdp_of(monitor: PrivacyMonitor) -> IncrementalRDP:
    """The monitor's RDP vector (saved in its state) as an IncrementalRDP."""
    rdp = IncrementalRDP()
    rdp.rdp = np.asarray(monitor.state_dict()["rdp"], dtype=float)
    return rdp


def test_rdp_conversion_equals_opacus() -> None:
    from opacus.accountants.analysis.rdp import get_privacy_spent

    rdp = IncrementalRDP()
    rng = np.random.default_rng(0)
    rows = rng.uniform(0.0, 3.0, size=(20, rdp.orders.size)) * rng.uniform(0, 1, size=(20, 1))
    got = rdp.epsilons(rows, DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns when the best order is an extreme one
        for row, eps in zip(rows, got, strict=True):
            assert eps == get_privacy_spent(orders=list(rdp.orders), rdp=list(row), delta=DELTA)[0]


def test_budget_stop_skips_the_update_and_every_later_step() -> None:
    values = _epsilons(4)
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=1,
        budget=PrivacyBudget(values[1], action="stop"),
    )
    train(model, opt, loader, 2)
    assert not monitor.should_stop
    before = [p.detach().clone() for p in model.parameters()]
    train(model, opt, loader, 3)
    assert monitor.should_stop and "step 3 would bring" in (monitor.stop_reason or "")
    assert engine.accountant.num_steps == 2 and [r.step for r in records] == [1, 2]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_budget_with_schedule_rolls_back_the_trace() -> None:
    engine, model, opt, loader = make_dp(momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, weighted_every=1, flush_every=1)
    train(model, opt, loader, 3, after=lambda _: sched.step())
    limit = monitor.last_record.heuristic_epsilon  # type: ignore[union-attr]
    trace = engine.accountant.optimizer_trace
    monitor.budget = PrivacyBudget(limit)
    with pytest.raises(PrivacyBudgetExceededError):
        train(model, opt, loader, 1)
    assert engine.accountant.optimizer_trace == trace
    assert engine.get_epsilon(DELTA) == pytest.approx(limit, rel=1e-9)


def test_doubling_cadence_computes_robust_and_pld_at_doubling_steps() -> None:
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, robust_every="doubling",
        standard_every="doubling",
    )
    train(model, opt, loader, 2 * DOUBLING_START + 3)
    monitor.flush()
    assert [r.step for r in records] == list(range(1, 2 * DOUBLING_START + 4))
    expensive = {DOUBLING_START, 2 * DOUBLING_START}
    assert {r.step for r in records if r.robust_heuristic_epsilon is not None} == expensive
    assert {r.step for r in records if r.standard_epsilon is not None} == expensive
    assert all(r.heuristic_epsilon is not None for r in records)
    at = records[2 * DOUBLING_START - 1]
    history = [tuple(h) for h in engine.accountant.history]
    assert len(history) == 1 and history[0][:2] == (1.0, 1 / 8)
    pld = StandardComposition([(1.0, 1 / 8, 2 * DOUBLING_START)]).epsilon(DELTA)
    assert at.standard_epsilon == pytest.approx(pld, rel=1e-12)


class _FakeClock:
    """The monitor's overhead clock, advanced by the test: training time passes only when
    the test says so, the monitor's own computations take none."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _auto_run(
    monkeypatch: pytest.MonkeyPatch, seconds_per_step: float, steps: int, **kw: Any
) -> list[EpsilonRecord]:
    clock = _FakeClock()
    monkeypatch.setattr(cadence_module, "clock", clock)
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt, **kw)
    assert monitor.robust_every == monitor.standard_every == "auto"  # the default

    def tick(_: int) -> None:
        clock.now += seconds_per_step

    train(model, opt, loader, steps, after=tick)
    monitor.finish()
    return records


def test_auto_cadence_skips_what_exceeds_the_overhead_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1 ms per step: 1% of 0.2 s of training is 2 ms, below the first costs assumed (10 ms
    # robust, 100 ms PLD): nothing before the final record, which has everything.
    records = _auto_run(monkeypatch, 1e-3, 2 * DOUBLING_START)
    assert all(r.robust_heuristic_epsilon is None and r.standard_epsilon is None for r in records[:-1])
    final = records[-1]
    assert final.final and final.robust_heuristic_epsilon is not None
    pld = StandardComposition([(1.0, 1 / 8, 2 * DOUBLING_START)]).epsilon(DELTA)
    assert final.standard_epsilon == pytest.approx(pld, rel=1e-12)


def test_auto_cadence_on_slow_steps_is_the_doubling_cadence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1 s per step: 1% of 100 s covers both first costs (and the measured ones, which take
    # no time on the fake clock): every doubling step has both values.
    records = _auto_run(monkeypatch, 1.0, 2 * DOUBLING_START + 3)
    expensive = {DOUBLING_START, 2 * DOUBLING_START}
    assert {r.step for r in records[:-1] if r.robust_heuristic_epsilon is not None} == expensive
    assert {r.step for r in records[:-1] if r.standard_epsilon is not None} == expensive
    # the budget is a fraction of the training time: 10x the fraction, 10x faster steps
    fast = _auto_run(monkeypatch, 0.1, 2 * DOUBLING_START + 3, max_overhead=0.1)
    assert [dataclasses.astuple(r) for r in fast] == [dataclasses.astuple(r) for r in records]


def test_overhead_budget_charges_what_was_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _FakeClock()
    monkeypatch.setattr(cadence_module, "clock", clock)
    budget = cadence_module.OverheadBudget(0.01)
    clock.now += 9.9  # 99 ms of budget: below the PLD's first cost (100 ms)
    assert budget.allows("robust") and not budget.allows("standard")
    clock.now += 0.2
    assert budget.allows("standard")
    budget.charge("standard", 0.5)  # measured: 0.5 s, now the expected cost too
    # needs spent + cost = 1.0 s <= 1% of (elapsed - spent): elapsed >= 100.5 s
    clock.now += 0.5 + 100.0 - 10.1 - 0.01
    assert not budget.allows("standard")
    clock.now += 0.02
    assert budget.allows("standard")
    budget.restart()
    assert budget.spent == 0.0 and not budget.allows("standard")


@pytest.mark.parametrize("every", [1, 7, 100, "doubling", "auto", None])
def test_due_steps_follow_the_cadence(every) -> None:
    steps = range(1, 20_001)
    due = {s for s in steps if _due(s, every)}
    if every is None:
        assert due == set()
    elif every in ("doubling", "auto"):  # "auto": and what the overhead budget allows
        assert due == {DOUBLING_START * 2**j for j in range(8)}  # 100 ... 12,800
    else:
        assert due == set(range(every, 20_001, every))


# -- arguments, state, attach ------------------------------------------------------------------


def test_arguments_are_checked() -> None:
    engine, _, opt, _ = make_dp()
    with pytest.raises(TypeError, match="`accountant`"):
        PrivacyMonitor(object(), delta=DELTA)
    with pytest.raises(ValueError, match="delta"):
        PrivacyMonitor(engine, delta=2.0)
    with pytest.raises(ValueError, match="`robust_every`"):
        PrivacyMonitor(engine, delta=DELTA, robust_every=0)
    with pytest.raises(ValueError, match="`standard_every` must be an integer >= 1, \"doubling\""):
        PrivacyMonitor(engine, delta=DELTA, standard_every="halving")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`flush_every` must be an integer >= 1 or None"):
        PrivacyMonitor(engine, delta=DELTA, flush_every="doubling")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`weighted_every` must be an integer >= 1, \"doubling\", \"auto\" or"):
        PrivacyMonitor(engine, delta=DELTA, weighted_every="every")  # type: ignore[arg-type]
    for bad in (0.0, 1.5, -0.1, True, "1%"):
        with pytest.raises(ValueError, match=r"`max_overhead` must be a number in \(0, 1\]"):
            PrivacyMonitor(engine, delta=DELTA, max_overhead=bad)  # type: ignore[arg-type]
    assert PrivacyMonitor(engine, delta=DELTA, max_overhead=np.float32(0.5))._overhead.fraction == 0.5
    with pytest.raises(TypeError, match=r"`sinks\[0\]`"):
        PrivacyMonitor(engine, delta=DELTA, sinks=[3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="`epsilon`"):
        PrivacyBudget(0.0)
    with pytest.raises(ValueError, match="`metric`"):
        PrivacyBudget(1.0, metric="pld")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`action`"):
        PrivacyBudget(1.0, action="warn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`optimizer`"):
        PrivacyMonitor(engine, delta=DELTA).attach(torch.optim.SGD([torch.zeros(1)], lr=1))
    PrivacyMonitor(engine, delta=DELTA, optimizer=opt)
    with pytest.raises(ValueError, match="attached already"):
        PrivacyMonitor(engine, delta=DELTA, optimizer=opt)


def test_detach_restores_the_optimizer() -> None:
    engine, model, opt, loader = make_dp()
    hook = opt.step_hook
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    train(model, opt, loader, 1)
    monitor.detach()  # flushes
    assert opt.step_hook is hook and "step" not in opt.original_optimizer.__dict__
    train(model, opt, loader, 1)
    assert len(records) == 1 and engine.accountant.num_steps == 2


def test_state_dict_round_trip_restores_the_accountant() -> None:
    engine, model, opt, loader = make_dp()
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt)
    train(model, opt, loader, 5)
    state = monitor.state_dict()
    engine2, *_ = make_dp()
    restored = PrivacyMonitor(engine2, delta=DELTA)
    restored.load_state_dict(state)
    assert engine2.accountant.history == engine.accountant.history
    assert restored.last_record == monitor.last_record
    assert np.array_equal(_rdp_of(restored).rdp, _rdp_of(monitor).rdp)  # the vector, saved
    with pytest.raises(ValueError, match="format 2"):
        restored.load_state_dict({"format": 3})
    for key in ("rdp", "physical_steps"):  # every key of the state is required
        with pytest.raises(ValueError, match=key):
            restored.load_state_dict({k: v for k, v in state.items() if k != key})
    partial = {k: v for k, v in state["last_record"].items() if k != "sampling"}
    with pytest.raises(ValueError, match="last_record"):
        restored.load_state_dict(state | {"last_record": partial})
    assert restored.last_record == monitor.last_record  # the rejected states changed nothing


def test_incremental_rdp_matches_opacus_for_several_segments() -> None:
    rdp = IncrementalRDP()
    history = [(1.0, 0.01, 30), (0.7, 0.02, 10)]
    rdp.reset(history)
    ref = RDPAccountant()
    ref.history = list(history)
    assert rdp.epsilon(DELTA) == pytest.approx(ref.get_epsilon(DELTA), rel=1e-9)
    rdp.add(0.0, 0.1)
    assert math.isinf(rdp.epsilon(DELTA))
    assert IncrementalRDP().epsilon(DELTA) == 0.0


def test_fields_are_the_record_fields(tmp_path) -> None:
    """FIELDS names every data attribute of a record the monitor emits, in the record's
    constructor order, and is the header and column order of the CSV file a monitor writes."""
    import csv

    from opacus_lastiterate.callbacks import CsvSink

    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    path = tmp_path / "privacy.csv"
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append, CsvSink(path)])
    monitor.attach(opt)
    train(model, opt, loader, 2)
    monitor.finish()
    record = records[-1]
    data = {
        name
        for name in dir(record)
        if not name.startswith("_") and not callable(getattr(record, name))
    }
    assert set(FIELDS) == data and len(FIELDS) == len(data)
    assert FIELDS[0] == "step" and "heuristic_epsilon" in FIELDS
    assert FIELDS[-6:] == (
        "final", "physical_steps", "sampling", "poisson_assumed_epsilon", "optimizer",
        "privacy_unit",
    )
    # positional construction in FIELDS order gives back the same record
    assert EpsilonRecord(*(getattr(record, f) for f in FIELDS)) == record
    assert list(record.as_dict()) == list(FIELDS)
    rows = list(csv.reader(path.read_text().splitlines()))
    # one row per step: the final record (step 2) replaced step 2's row
    per_step = [r for r in records if not r.final][:-1] + [records[-1]]
    assert rows[0] == list(FIELDS) and len(rows) == 1 + len(per_step)
    assert rows[-1][FIELDS.index("final")] == "True"
    for row, rec in zip(rows[1:], per_step, strict=True):
        assert dict(zip(FIELDS, row, strict=True))["step"] == str(rec.step)
        assert float(dict(zip(FIELDS, row, strict=True))["opacus_rdp_epsilon"]) == pytest.approx(
            rec.opacus_rdp_epsilon, rel=1e-12
        )


# -- GPU safety ---------------------------------------------------------------------------------


class _HostReads:
    """Counts Tensor.item/.cpu/.tolist/__float__/.numpy calls while installed."""

    NAMES = ("item", "cpu", "tolist", "__float__", "numpy")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(*args, __original=original, **kwargs):  # type: ignore[no-untyped-def]
                self.count += 1
                return __original(*args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _host_reads(
    monkeypatch: pytest.MonkeyPatch,
    with_monitor: bool,
    steps: int = 5,
    check_wiring: bool = False,
    uncounted: int = 0,
) -> int:
    """Host reads of ``steps`` training steps, after ``uncounted`` steps not counted."""
    engine, model, opt, loader = make_dp()
    if with_monitor:
        PrivacyMonitor(
            engine, delta=DELTA, optimizer=opt, robust_every=2, standard_every=2, flush_every=1,
            check_wiring=check_wiring,
        )
    batches = [next(iter(loader)) for _ in range(uncounted + steps)]

    def train(part: list[Any]) -> None:
        for x, y in part:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    train(batches[:uncounted])
    with monkeypatch.context() as m:
        reads = _HostReads(m)
        train(batches[uncounted:])
        return reads.count


def test_monitor_reads_no_tensor_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    without = _host_reads(monkeypatch, with_monitor=False)
    with_monitor = _host_reads(monkeypatch, with_monitor=True)
    assert with_monitor == without


def test_wiring_check_reads_tensors_at_its_probe_step_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without = _host_reads(monkeypatch, with_monitor=False, uncounted=1)
    checked = _host_reads(monkeypatch, with_monitor=True, check_wiring=True, uncounted=1)
    assert checked == without
    # the probe step itself does read (so the comparison above covers the check)
    probe = _host_reads(monkeypatch, with_monitor=True, check_wiring=True, steps=1)
    assert probe > _host_reads(monkeypatch, with_monitor=False, steps=1)


def test_monitor_arms_the_wiring_check_by_default() -> None:
    engine, model, opt, loader = make_dp()
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt)
    assert monitor.wiring is not None and monitor.wiring.report is None
    x, y = next(iter(loader))
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    assert monitor.wiring.report is not None
    off = PrivacyMonitor(make_dp()[0], delta=DELTA, check_wiring=False)
    assert off.wiring is None
    with pytest.raises(TypeError, match="check_wiring"):
        PrivacyMonitor(engine, delta=DELTA, check_wiring=1)  # type: ignore[arg-type]


def test_counting_detects_a_host_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter of the test above does see a .item() (so that test can fail)."""
    with monkeypatch.context() as m:
        reads = _HostReads(m)
        torch.ones(2).sum().item()
        assert reads.count == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_no_synchronisation_on_cuda() -> None:  # pragma: no cover - no GPU in CI
    engine, model, opt, loader = make_dp()
    model.cuda()
    PrivacyMonitor(
        engine, delta=DELTA, optimizer=opt, robust_every=2, standard_every=2, flush_every=1,
        check_wiring=False,
    )
    batches = [(x.cuda(), y.cuda()) for x, y in [next(iter(loader)) for _ in range(3)]]
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in batches[1:]:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_tensor_learning_rate_on_cpu_is_read() -> None:
    from opacus_lastiterate.callbacks.monitor import _host_float

    assert _host_float(torch.tensor(0.25)) == 0.25
    assert _host_float(0.5) == 0.5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_is_monitored(dtype: torch.dtype, device: str) -> None:
    engine, model, opt, loader = make_dp()
    model.to(device)
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=1)
    for x, y in [next(iter(loader)) for _ in range(3)]:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    assert [r.step for r in records] == [1, 2, 3]
    # the accountant, asked only now, solves cold: equal to the root finder's tolerance
    assert records[-1].heuristic_epsilon == pytest.approx(engine.get_epsilon(DELTA), rel=1e-12)
    assert all(p.device.type == device and p.dtype == torch.float32 for p in model.parameters())


# -- queued steps of one setting, replayed together ----------------------------------------


def _records(flush_every: int, steps: int) -> list[EpsilonRecord]:
    engine, model, opt, loader = make_dp(sigma=0.9)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, flush_every=flush_every,
        robust_every=10, standard_every=25,
    )  # fmt: skip
    train(model, opt, loader, steps)
    monitor.finish()
    return records


def test_batched_records_equal_step_by_step_records() -> None:
    """flush_every=40 replays runs of queued steps together, cut where a robust or PLD
    value is due; every record equals the one of a monitor that evaluates each step as it
    comes (flush_every=1): the heuristic to the root finder's tolerance, the rest exactly."""
    one, many = _records(1, 90), _records(40, 90)
    assert [r.step for r in many] == [r.step for r in one] == [*range(1, 91), 90]
    for a, b in zip(one, many, strict=True):
        assert b.heuristic_epsilon == pytest.approx(a.heuristic_epsilon, rel=BATCHED)
        assert dataclasses.replace(b, heuristic_epsilon=None) == dataclasses.replace(
            a, heuristic_epsilon=None
        )
    assert sum(r.robust_heuristic_epsilon is not None for r in many) == 10  # steps 10..90, and the end


def _replica() -> Any:
    return LastIterateAccountant()


SGD = SGDSettings(0.1, 0.0, 0.0, False, 0.0)  # lr, momentum, dampening, nesterov, weight decay


def test_replay_constant_warns_where_step_by_step_warns() -> None:
    """(sigma, q) = (0.39, 0.02) is not monotone in T: the batch gives the same warning,
    naming the same step, as replay + get_epsilon step by step."""
    from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning

    one, many = _replica(), _replica()
    with pytest.warns(NonMonotoneHeuristicWarning) as by_step:
        want = []
        for _ in range(150):
            one.replay_step(0.39, 0.02, SGD)
            want.append(one.get_epsilon(1e-6))
    with pytest.warns(NonMonotoneHeuristicWarning) as batched:
        got = np.concatenate([many.replay_steps(0.39, 0.02, SGD, 50, delta=1e-6) for _ in range(3)])
    np.testing.assert_allclose(got, want, rtol=BATCHED)
    assert [str(w.message) for w in batched] == [str(w.message) for w in by_step]
    assert many.state_dict() == one.state_dict()  # history and optimizer trace


def test_replay_constant_declines_what_only_step_by_step_answers() -> None:
    replica = _replica()
    assert replica.replay_steps(0.0, 0.05, SGD, 10, delta=1e-5) is None  # no noise
    assert replica.replay_steps(
        1.0, 0.05, SGDSettings(0.1, 0.9, 0.0, False, 0.0), 10, delta=1e-5
    ) is None
    assert replica.num_steps == 0  # nothing recorded
    # resumed at step 200: the single-segment check first sweeps the shorter runs, two per
    # query, step by step; the batch path takes over once that is done
    resumed = _replica()
    resumed.load_state_dict({"history": [(1.0, 0.05, 200)], "mechanism": "last_iterate"})
    assert resumed.replay_steps(1.0, 0.05, SGD, 10, delta=1e-5) is None
    for _ in range(100):
        resumed.replay_step(1.0, 0.05, SGD)
        resumed.get_epsilon(1e-5)
    assert resumed.replay_steps(1.0, 0.05, SGD, 10, delta=1e-5) is not None
    # a second segment: solved together too (the multi-segment check takes the work of the
    # batch's queries at once)
    two = _replica()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # monotone so far: the check is still on
        assert two.replay_steps(3.0, 0.01, SGD, 10, delta=1e-5) is not None
        assert two.replay_steps(3.5, 0.01, SGD, 10, delta=1e-5) is not None
    assert two.history == [(3.0, 0.01, 10), (3.5, 0.01, 10)]
    with pytest.raises(ValueError, match="noise_multiplier"):
        two.replay_steps([1.0, 2.0], 0.01, SGD, 3, delta=1e-5)  # one sigma per step
    with pytest.raises(ValueError, match="noise_multiplier"):
        two.replay_steps([1.0, -1.0, 1.0], 0.01, SGD, 3, delta=1e-5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        two.replay_steps([[1.0], [1.1]], 0.01, SGD, 2, delta=1e-5)  # one number per step
    for bad in (["1.0", "1.1"], [True, True]):
        with pytest.raises(TypeError, match="noise_multiplier"):
            two.replay_steps(bad, 0.01, SGD, 2, delta=1e-5)
    assert two.num_steps == 20
    assert two.replay_steps(np.array(3.5), 0.01, SGD, 2, delta=1e-5) is not None  # 0-d: one
    assert two.history[-1] == (3.5, 0.01, 12)


@pytest.mark.parametrize("sigma0, gamma, q", [(1.2, 0.995, 0.03), (0.8, 1.00001, 0.05)])
def test_replay_of_a_noise_schedule_gives_the_values_of_each_step(sigma0, gamma, q) -> None:
    """A noise multiplier that changes at every step (Opacus's ExponentialNoise): the batch
    solve gives what replay + get_epsilon give step by step, the last value is the
    heuristic of the whole run computed from scratch (the registry's model), and the
    non-monotone run (at T = 2: the second step's noise lowers epsilon) gets the warning
    that step by step gives, naming the same step, though the batches are of 100 steps."""
    from opacus_lastiterate.analysis import DPSGDRun
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning

    sigmas = [sigma0 * gamma**t for t in range(300)]
    one, many = _replica(), _replica()
    want = []
    with pytest.warns(NonMonotoneHeuristicWarning) as by_step:
        for sigma in sigmas:
            one.replay_step(sigma, q, SGD)
            want.append(one.get_epsilon(1e-5))
    with pytest.warns(NonMonotoneHeuristicWarning) as batched:
        got = np.concatenate([
            many.replay_steps(sigmas[k:k + 100], q, SGD, 100, delta=1e-5)
            for k in range(0, 300, 100)
        ])  # fmt: skip
    assert [str(w.message) for w in batched] == [str(w.message) for w in by_step]
    assert "after T = 2 steps" in str(batched[0].message)
    np.testing.assert_allclose(got, want, rtol=BATCHED)
    assert many.state_dict() == one.state_dict()
    scratch = privacy_model("heuristic", DPSGDRun([(s, q, 1) for s in sigmas]))
    assert got[-1] == pytest.approx(scratch.epsilon(1e-5), rel=1e-9)


def test_sparse_weighted_cadence_logs_a_certified_value() -> None:
    """weighted_every >= 50: the replica's characteristic function is kept step by step,
    frozen at the steps where it was asked, so the replica's value (asked at 50 and 100) is
    another certified upper bound, within the accountant's bracket [lower bound,
    value / (1 - accuracy)] at that step."""
    engine, model, opt, loader = make_dp(momentum=0.9)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt, weighted_every=50,
        robust_every=None, standard_every=None,
    )  # fmt: skip
    train(model, opt, loader, 100)
    monitor.flush()
    acc = engine.accountant
    result = acc.weighted_result(DELTA)
    logged = records[99].heuristic_epsilon
    assert [r.step for r in records if r.heuristic_epsilon is not None] == [50, 100]
    assert result.lower_bound <= logged <= result.epsilon / (1.0 - acc.weight_accuracy)


def test_records_and_budgets_take_only_the_field_names() -> None:
    """The fields are named <model>_epsilon after the registry: a record with another key,
    or a budget on another metric, is refused."""
    engine, model, opt, loader = make_dp()
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=1)
    train(model, opt, loader, 3)
    monitor.flush()
    record = monitor.last_record
    assert record is not None
    values = record.as_dict()
    assert EpsilonRecord.from_dict(values) == record
    values["robust_epsilon"] = values.pop("robust_heuristic_epsilon")
    with pytest.raises(ValueError, match="keys"):
        EpsilonRecord.from_dict(values)
    with pytest.raises(ValueError, match="`metric`"):
        PrivacyBudget(1.0, metric="robust_epsilon")  # type: ignore[arg-type]


def test_a_monitor_that_was_not_attached_does_not_report_in_silence() -> None:
    """The README mistake: a monitor built without the optimizer. If it saw none of the
    accountant's steps, finish() raises with the fix in the message and emits nothing; if it
    saw some, its final record covers those and a warning says so; a monitor that saw
    nothing of a run without steps warns."""
    from opacus_lastiterate.callbacks import MonitorWarning

    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append])  # not attached
    with pytest.warns(MonitorWarning, match="never attached"):
        assert monitor.finish() is None
    train(model, opt, loader, 3)
    with pytest.raises(RuntimeError, match=r"3 step\(s\).*monitor\.attach\(optimizer\)"):
        monitor.finish()
    assert records == []
    attached = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    train(model, opt, loader, 2)
    final = attached.finish()
    assert final is not None and final.step == 5 and [r.step for r in records] == [4, 5, 5]
    attached.detach()
    train(model, opt, loader, 2)  # not seen
    with pytest.warns(MonitorWarning, match=r"2 step\(s\) that this monitor did not see"):
        again = attached.finish()
    assert again is not None and again.step == 5
