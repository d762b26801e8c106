"""Fault injection: the accountant changes under an attached monitor (a resume the Opacus way,
a load mid-run, a second optimizer stepping it, an optimizer of another engine). The monitor
detects it at the next step and follows the accountant (records and budget guard of its true
state), or refuses with a clear error; never silently wrong.

Reference values are independent of the monitor: Opacus's ``RDPAccountant`` for the RDP
epsilon, a quadrature of the constant-rate heuristic (``tests/analysis/_reference.py``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from opacus_lastiterate.accountants.any_accountant import steps_of
from opacus_lastiterate.callbacks import (
    EpsilonRecord,
    JsonlSink,
    MonitorWarning,
    PrivacyBudget,
    PrivacyBudgetExceededError,
    PrivacyMonitor,
)
from tests.analysis._reference import QuadratureHeuristic
from tests.callbacks.conftest import DELTA, make_dp, train

Q, SIGMA = 1 / 8, 1.0  # make_dp's run: 256 examples in batches of 32, noise 1.0
REL = 1e-6  # the monitor's values against the quadrature (its tolerance is about 1e-9)


def _rdp_epsilon(steps: int) -> float:
    reference = RDPAccountant()
    reference.history = [(SIGMA, Q, steps)]
    return float(reference.get_epsilon(DELTA))


def _checkpoint_after(steps: int, tmp_path: Path, accountant: str) -> Path:
    """An earlier run of ``steps`` steps, saved the Opacus way (module, optimizer,
    accountant)."""
    engine, model, opt, loader = make_dp(accountant=accountant, seed=1)
    train(model, opt, loader, steps)
    path = tmp_path / "run.pt"
    engine.save_checkpoint(path=path, module=model, optimizer=opt)
    return path


def _truth(metric: str, steps: int) -> float:
    if metric == "heuristic_epsilon":
        return QuadratureHeuristic(steps, Q, SIGMA).epsilon(DELTA)
    return _rdp_epsilon(steps)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("accountant", ["last_iterate", "rdp", "gdp"])
def test_resume_the_opacus_way_after_building_the_monitor(tmp_path: Path, accountant: str) -> None:
    """The monitor is built first, then the engine loads a checkpoint of 100 steps: the row
    of step 200 is the accountant's 200-step value, and a budget between the 100-step and
    the 200-step values fires at the first step over it. (Opacus's own accountants have no
    revision token: their step count tells; GaussianAccountant replaces its history list at
    every step, which is no change.)"""
    metric = "heuristic_epsilon" if accountant == "last_iterate" else "opacus_rdp_epsilon"
    path = _checkpoint_after(100, tmp_path, accountant)
    engine, model, opt, loader = make_dp(accountant=accountant)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt,
                             robust_every=None, standard_every=None)  # fmt: skip
    engine.load_checkpoint(path=path, module=model, optimizer=opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MonitorWarning)  # nothing seen yet: a plain resume
        train(model, opt, loader, 100)
    monitor.flush()
    assert steps_of(engine.accountant) == 200
    assert [r.step for r in records] == list(range(101, 201))
    last = records[-1]
    assert last.opacus_rdp_epsilon == pytest.approx(_rdp_epsilon(200), rel=1e-9)
    truth = _truth(metric, 200)
    assert getattr(last, metric) == pytest.approx(truth, rel=REL)

    # the budget guard evaluates the true value: it fires at the first step over the limit
    limit = (_truth(metric, 100) + truth) / 2
    engine, model, opt, loader = make_dp(accountant=accountant)
    PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=None, standard_every=None,
                   budget=PrivacyBudget(limit, metric=metric, action="raise"))  # fmt: skip
    engine.load_checkpoint(path=path, module=model, optimizer=opt)
    with pytest.raises(PrivacyBudgetExceededError) as info:
        train(model, opt, loader, 100)
    step = info.value.step
    assert 100 < step < 200 and steps_of(engine.accountant) == step - 1
    assert _truth(metric, step - 1) <= limit * (1 + REL)
    assert _truth(metric, step) > limit * (1 - REL)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("change", ["load", "reset", "take_back"])
def test_a_change_of_the_accountant_mid_run_is_followed_with_a_warning(
    change: str, tmp_path: Path
) -> None:
    """20 steps seen, then the accountant is changed behind the monitor: at the next step a
    MonitorWarning says so and the records from there on are the accountant's; a JSONL log
    goes back with it (each step once, in order)."""
    from opacus_lastiterate.accountants import FEASGMAccountant

    engine, model, opt, loader = make_dp()
    corrected = FEASGMAccountant().configure(dataset_size=256, batch_size=32)  # fed by it
    records: list[EpsilonRecord] = []
    log = tmp_path / "records.jsonl"
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append, JsonlSink(log)],
                             optimizer=opt,
                             robust_every=None, standard_every=None, flush_every=None,
                             corrected_accountant=corrected)  # fmt: skip
    train(model, opt, loader, 20)
    acc = engine.accountant
    if change == "load":
        other = make_dp(seed=2)
        train(*other[1:], 50)
        acc.load_state_dict(other[0].accountant.state_dict())
        start = 50
    elif change == "reset":
        acc.history = []
        start = 0
    else:
        acc.take_back(5)
        start = 15
    with pytest.warns(MonitorWarning, match="accountant changed without this monitor"):
        train(model, opt, loader, 1)
    train(model, opt, loader, 9)
    monitor.flush()
    after = [r for r in records if r.step > start]
    assert [r.step for r in after][-10:] == list(range(start + 1, start + 11))
    last = after[-1]
    assert acc.num_steps == start + 10 == last.step
    assert corrected.history == acc.history  # the accountant it feeds follows too
    assert last.opacus_rdp_epsilon == pytest.approx(_rdp_epsilon(start + 10), rel=1e-9)
    truth = QuadratureHeuristic(start + 10, Q, SIGMA).epsilon(DELTA)
    assert last.heuristic_epsilon == pytest.approx(truth, rel=REL)
    logged = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    kept = [s for s in range(1, 21) if s <= start]  # the rows before the change it kept
    assert logged == [*kept, *range(start + 1, start + 11)]


def test_two_optimizers_on_one_accountant_are_detected_at_the_step() -> None:
    """One engine, two make_private optimizers, a monitor on each: the first step at which a
    monitor meets the other optimizer's steps warns (not finish()), and both monitors report
    the accountant's whole history."""
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    engine = PrivacyEngine(accountant="last_iterate")
    parts = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 4))
        data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts.append(engine.make_private(
                module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                data_loader=DataLoader(data, batch_size=32), noise_multiplier=SIGMA,
                max_grad_norm=1.0,
            ))  # fmt: skip
    monitors = [
        PrivacyMonitor(engine, delta=DELTA, optimizer=opt, robust_every=None,
                       standard_every=None, flush_every=None)
        for _, opt, _ in parts
    ]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(10):
            for model, opt, loader in parts:
                train(model, opt, loader, 1)
        monitored = [w for w in caught if issubclass(w.category, MonitorWarning)]
    # each monitor warns once, at the first step where the other's steps are met
    assert len(monitored) == 2 and all("did not pass through" in str(w.message) for w in monitored)
    truth = QuadratureHeuristic(20, Q, SIGMA).epsilon(DELTA)
    for monitor in monitors:
        final = monitor.finish()
        assert final is not None and final.step == 20 == engine.accountant.num_steps
        assert final.heuristic_epsilon == pytest.approx(truth, rel=REL)
        assert final.opacus_rdp_epsilon == pytest.approx(_rdp_epsilon(20), rel=1e-9)


def test_an_optimizer_of_another_engine_is_refused_at_construction() -> None:
    engine_a, *_ = make_dp()
    engine_b, model_b, opt_b, loader_b = make_dp(seed=1)
    with pytest.raises(ValueError, match="another accountant"):
        PrivacyMonitor(engine_a, delta=DELTA, optimizer=opt_b)
    assert engine_a.accountant.num_steps == 0
    train(model_b, opt_b, loader_b, 1)  # the optimizer was left as it was
    assert engine_b.accountant.num_steps == 1
    # a hook that hides its accountant (wrapped by the user): refused at the first step,
    # before the update, rather than reporting steps that were not accounted
    engine_c, *_ = make_dp(seed=2)
    inner = opt_b.step_hook
    opt_b.step_hook = lambda optim: inner(optim)
    PrivacyMonitor(engine_c, delta=DELTA, optimizer=opt_b)
    weights = [p.detach().clone() for p in model_b.parameters()]
    with pytest.raises(RuntimeError, match="did not record this step in the monitor's"):
        train(model_b, opt_b, loader_b, 1)
    assert all(torch.equal(a, b) for a, b in zip(weights, model_b.parameters(), strict=True))
    assert engine_c.accountant.num_steps == 0
