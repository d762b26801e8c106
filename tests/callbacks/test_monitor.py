"""PrivacyMonitor: the values it records are the accountant's, on their cadences; the
budget guard refuses exactly the first step over the limit; no tensor is read per step."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.callbacks import (
    FIELDS,
    EpsilonRecord,
    IncrementalRDP,
    PrivacyBudget,
    PrivacyBudgetExceededError,
    PrivacyMonitor,
)
from tests.callbacks.conftest import DELTA, make_dp, train


def test_records_equal_the_accountant_at_every_step() -> None:
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    expected: list[tuple[int, float, float]] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], robust_every=3, standard_every=4
    )
    monitor.attach(opt)

    def check(step: int) -> None:
        acc = engine.accountant
        expected.append((acc.num_steps, acc.get_epsilon(DELTA), acc.get_epsilon(DELTA, robust=True)))

    train(model, opt, loader, 8, after=check)
    assert [r.step for r in records] == list(range(1, 9))
    for r, (steps, heuristic, robust) in zip(records, expected, strict=True):
        assert r.step == steps
        assert r.heuristic_epsilon == heuristic
        assert (r.robust_epsilon is not None) == (r.step % 3 == 0)
        if r.robust_epsilon is not None:
            assert r.robust_epsilon == pytest.approx(robust, rel=1e-12)
        assert (r.standard_epsilon_pld is not None) == (r.step % 4 == 0)
        assert r.lr == 0.1 and r.noise_multiplier == 1.0 and r.sample_rate == 1 / 8
        assert r.corrected_epsilon is None and not r.final
    # the RDP bound equals Opacus's RDP accountant; the PLD value is the tight one below it
    rdp = RDPAccountant()
    rdp.history = [(1.0, 1 / 8, 8)]
    assert records[-1].standard_epsilon_rdp == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-9)
    pld = StandardComposition([(1.0, 1 / 8, 8)]).epsilon(DELTA)
    assert records[7].standard_epsilon_pld == pytest.approx(pld, rel=1e-12)
    assert pld < records[-1].standard_epsilon_rdp
    final = monitor.finish()
    assert final is not None and final.final and final.step == 8
    assert final.robust_epsilon is not None and final.standard_epsilon_pld is not None
    assert monitor.records_emitted == 9


def test_momentum_and_schedule_use_the_weighted_value() -> None:
    engine, model, opt, loader = make_dp(momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    lrs: list[float] = []

    def after(step: int) -> None:
        assert records[-1].heuristic_epsilon == engine.accountant.get_epsilon(DELTA)
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()

    train(model, opt, loader, 6, after=after)
    assert [r.lr for r in records] == lrs  # the learning rate the step used


def test_corrected_accountant_is_fed_and_reported() -> None:
    from opacus_lastiterate.accountants import FEASGMAccountant

    engine, model, opt, loader = make_dp()
    corrected = FEASGMAccountant().configure(dataset_size=256, batch_size=32)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], corrected_accountant=corrected,
        standard_every=2, optimizer=opt,
    )
    train(model, opt, loader, 4)
    assert corrected.history == engine.accountant.history
    assert [r.corrected_epsilon is not None for r in records] == [False, True, False, True]
    assert records[3].corrected_epsilon == pytest.approx(corrected.get_epsilon(DELTA))
    monitor.finish()


def test_other_accountants_give_standard_only() -> None:
    engine, model, opt, loader = make_dp(accountant="rdp")
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    train(model, opt, loader, 3)
    assert records[-1].heuristic_epsilon is None
    assert records[-1].standard_epsilon_rdp == pytest.approx(engine.get_epsilon(DELTA), rel=1e-9)


# -- budget guard ------------------------------------------------------------------------------


def _epsilons(steps: int) -> list[float]:
    engine, model, opt, loader = make_dp()
    values: list[float] = []
    train(model, opt, loader, steps, after=lambda _: values.append(engine.get_epsilon(DELTA)))
    return values


@pytest.mark.parametrize("metric", ["heuristic_epsilon", "standard_epsilon_rdp"])
def test_budget_raises_exactly_before_the_first_step_over_the_limit(metric: str) -> None:
    engine, model, opt, loader = make_dp()
    probe = PrivacyMonitor(engine, delta=DELTA, optimizer=opt, sinks=[])
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
    assert monitor.last_record is not None and monitor.last_record.step == 4
    assert getattr(monitor.last_record, metric) == pytest.approx(limit, rel=1e-12)
    assert monitor._rdp.epsilon(DELTA) == pytest.approx(monitor.last_record.standard_epsilon_rdp)


def test_budget_stop_skips_the_update_and_every_later_step() -> None:
    values = _epsilons(4)
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], optimizer=opt,
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
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt)
    train(model, opt, loader, 3, after=lambda _: sched.step())
    limit = monitor.last_record.heuristic_epsilon  # type: ignore[union-attr]
    trace = engine.accountant.optimizer_trace
    monitor.budget = PrivacyBudget(limit)
    with pytest.raises(PrivacyBudgetExceededError):
        train(model, opt, loader, 1)
    assert engine.accountant.optimizer_trace == trace
    assert engine.get_epsilon(DELTA) == pytest.approx(limit, rel=1e-9)


# -- arguments, state, attach ------------------------------------------------------------------


def test_arguments_are_checked() -> None:
    engine, _, opt, _ = make_dp()
    with pytest.raises(TypeError, match="`accountant`"):
        PrivacyMonitor(object(), delta=DELTA)
    with pytest.raises(ValueError, match="delta"):
        PrivacyMonitor(engine, delta=2.0)
    with pytest.raises(ValueError, match="`robust_every`"):
        PrivacyMonitor(engine, delta=DELTA, robust_every=0)
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
    monitor.detach()
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
    assert restored._rdp.epsilon(DELTA) == pytest.approx(monitor._rdp.epsilon(DELTA))
    with pytest.raises(ValueError, match="format 1"):
        restored.load_state_dict({"format": 2})


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


def test_fields_are_the_record_fields() -> None:
    assert FIELDS[0] == "step" and "heuristic_epsilon" in FIELDS and FIELDS[-1] == "final"


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


def _host_reads(monkeypatch: pytest.MonkeyPatch, with_monitor: bool, steps: int = 5) -> int:
    engine, model, opt, loader = make_dp()
    if with_monitor:
        PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=2, standard_every=2)
    batches = [next(iter(loader)) for _ in range(steps)]
    with monkeypatch.context() as m:
        reads = _HostReads(m)
        for x, y in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return reads.count


def test_monitor_reads_no_tensor_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    without = _host_reads(monkeypatch, with_monitor=False)
    with_monitor = _host_reads(monkeypatch, with_monitor=True)
    assert with_monitor == without


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
    PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=2, standard_every=2)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_is_monitored(dtype: torch.dtype) -> None:
    engine, model, opt, loader = make_dp()
    records: list[EpsilonRecord] = []
    PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    for x, y in [next(iter(loader)) for _ in range(3)]:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    assert [r.step for r in records] == [1, 2, 3]
    assert records[-1].heuristic_epsilon == engine.get_epsilon(DELTA)
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in model.parameters())
