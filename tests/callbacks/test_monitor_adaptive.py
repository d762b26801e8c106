"""PrivacyMonitor on an AdamW run with a linear warm-up and decay: one record per step,
each with the adaptive heuristic (checked against an independent numpy AdamW with the second
moment frozen), no fallback warning; the adaptive trace survives the monitor's checkpoint."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.accountants.adaptive_trace import adaptive_trace_as_lists
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.callbacks import EpsilonRecord, JsonlSink, PrivacyMonitor
from opacus_lastiterate.exceptions import OptimizerTraceWarning
from tests.callbacks.conftest import BATCH, DELTA, N, make_dp, train

SIGMA, CLIP, LR, BETAS, WD = 1.0, 1.0, 0.01, (0.9, 0.99), 0.1
WARMUP, STEPS = 3, 10

pytestmark = pytest.mark.filterwarnings(
    "ignore::opacus_lastiterate.exceptions.AdaptiveHeuristicWarning",
    "ignore:Full backward hook is firing:UserWarning",
)


def _lambda(step: int) -> float:
    return (step + 1) / WARMUP if step < WARMUP else (STEPS - step) / (STEPS - WARMUP)


def _make_private(
    make_model: Any, make_optimizer: Any, sigma: float
) -> tuple[Any, nn.Module, Any, DataLoader]:
    """(engine, model, optimizer, loader) of a seeded random 16-feature, 4-class task."""
    from opacus import PrivacyEngine

    torch.manual_seed(0)
    x, y = torch.randn(N, 16), torch.randint(0, 4, (N,))
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model, optimizer=optimizer,
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH),
            noise_multiplier=sigma, max_grad_norm=CLIP,
        )
    return engine, model, optimizer, loader


def _make_adamw() -> tuple[Any, nn.Module, Any, DataLoader]:
    return _make_private(
        lambda: nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)),
        lambda params: torch.optim.AdamW(params, lr=LR, betas=BETAS, weight_decay=WD),
        SIGMA,
    )


def _numpy_adamw_weights(lrs: list[float]) -> np.ndarray:
    """AdamW on one coordinate, v_t frozen at its expectation under N(0, (sigma C / B)^2)
    gradients; weights = negated response of the final parameter to a unit gradient."""
    b1, b2 = BETAS
    s2 = (SIGMA * CLIP / BATCH) ** 2
    T = len(lrs)
    v = np.empty(T)
    acc = 0.0
    for t in range(T):
        acc = b2 * acc + (1 - b2) * s2
        v[t] = acc
    w = np.empty(T)
    for impulse in range(T):
        p = m = 0.0
        for t in range(T):
            p *= 1 - lrs[t] * WD
            m = b1 * m + (1 - b1) * (t == impulse)
            p -= lrs[t] * m / (1 - b1 ** (t + 1)) / (math.sqrt(v[t] / (1 - b2 ** (t + 1))) + 1e-8)
        w[impulse] = -p
    return w


def test_monitor_logs_the_adaptive_heuristic_every_step(tmp_path: Path) -> None:
    engine, model, opt, loader = _make_adamw()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambda)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append, JsonlSink(tmp_path / "log.jsonl")],
        optimizer=opt, weighted_every=1, flush_every=None,
    )
    lrs: list[float] = []

    def after(step: int) -> None:
        lrs.append(opt.param_groups[0]["lr"])
        sched.step()

    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)
        train(model, opt, loader, STEPS, after=after)
        monitor.flush()
    assert [r.step for r in records] == list(range(1, STEPS + 1))  # one row per step
    assert engine.accountant.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert engine.accountant.adaptive_optimizer == "adamw"
    # every record names the optimizer, and its labels (also read back from the JSONL file)
    # say what the heuristic is
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["optimizer"] for r in rows] == ["adamw"] * STEPS
    for r in records + [EpsilonRecord.from_dict(row) for row in rows]:
        assert r.optimizer == "adamw"
        assert ADAPTIVE_HEURISTIC_LABEL in r.labels()["heuristic_epsilon"]
    assert [r.lr for r in records] == lrs and len(set(lrs)) > 3
    q = BATCH / N
    for r in records:
        assert r.heuristic_epsilon is not None
        w = _numpy_adamw_weights(lrs[: r.step])
        run = DPSGDRun.constant(steps=r.step, sample_rate=q, noise_multiplier=SIGMA)
        expected = privacy_model("heuristic", DPSGDRun(run.segments, weights=w)).epsilon(DELTA)
        assert r.heuristic_epsilon == pytest.approx(expected, rel=2e-3)
    # the constant-rate formula would differ: the weights are in use
    plain = privacy_model("heuristic", DPSGDRun.constant(
        steps=STEPS, sample_rate=q, noise_multiplier=SIGMA)).epsilon(DELTA)
    assert abs(records[-1].heuristic_epsilon - plain) > 1e-2 * plain


def test_default_cadences_give_one_row_per_step_and_the_final_heuristic() -> None:
    """Default cadences (``weighted_every="auto"``: the steps whose value fits the overhead
    budget of this toy model's sub-millisecond steps): still one row per step, and the
    final record carries the accountant's adaptive heuristic."""
    engine, model, opt, loader = _make_adamw()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambda)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt,
                             flush_every=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)
        train(model, opt, loader, STEPS, after=lambda step: sched.step())
        final = monitor.finish()
    assert [r.step for r in records] == [*range(1, STEPS + 1), STEPS]
    assert final is not None and final.heuristic_epsilon is not None
    # the replica and the accountant each keep their own engine, asked at different steps
    # (the "auto" cadence depends on timing): equal within the weighted accuracy
    acc = engine.accountant
    assert final.heuristic_epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=2 * acc.weight_accuracy)


def test_adaptive_trace_survives_the_monitor_checkpoint() -> None:
    engine, model, opt, loader = _make_adamw()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lambda)
    monitor = PrivacyMonitor(engine, delta=DELTA, optimizer=opt)
    train(model, opt, loader, 6, after=lambda step: sched.step())
    state = json.loads(json.dumps(monitor.state_dict()))  # plain, JSON-serialisable
    engine2, *_ = _make_adamw()
    restored = PrivacyMonitor(engine2, delta=DELTA)
    restored.load_state_dict(state)
    acc, acc2 = engine.accountant, engine2.accountant
    assert acc2.adaptive_trace == acc.adaptive_trace
    assert acc2.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert acc2.get_epsilon(DELTA) == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    assert isinstance(state["accountant"]["adaptive_trace"]["lr"]["values"], str)  # base64
    bad = json.loads(json.dumps(state))
    trace = adaptive_trace_as_lists(bad["accountant"]["adaptive_trace"])
    trace["beta1"]["values"][0] = 1.5
    bad["accountant"]["adaptive_trace"] = trace
    with pytest.raises(ValueError, match="beta1"):
        restored.load_state_dict(bad)
    assert acc2.adaptive_trace == acc.adaptive_trace  # nothing changed


def test_sgd_records_keep_the_plain_label() -> None:
    """The label follows the run: an SGD run's records name no adaptive optimizer."""
    engine, model, opt, loader = make_dp(momentum=0.9)
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=opt)
    train(model, opt, loader, 3)
    monitor.finish()
    assert records and all(r.optimizer is None for r in records)
    assert engine.accountant.adaptive_optimizer is None
    assert ADAPTIVE_HEURISTIC_LABEL not in records[-1].labels()["heuristic_epsilon"]


def test_monitor_of_an_adam_run_whose_weights_flip_sign_warns_and_labels_what_it_computed():
    """Adam with an L2 weight decay far above its preconditioner: the monitor's records are
    the constant-rate heuristic (independent: privacy_model on the constant run), labelled as
    the plain heuristic, after one OptimizerTraceWarning; no step is interrupted."""
    engine, model, optimizer, loader = _make_private(
        lambda: nn.Linear(16, 4),
        lambda params: torch.optim.Adam(params, lr=0.5, weight_decay=0.2),
        1.0,
    )
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], optimizer=optimizer)
    with pytest.warns(OptimizerTraceWarning, match="finite and >= 0"):
        steps = train(model, optimizer, loader, steps=6)
        final = monitor.finish()
    assert [r.step for r in records[:-1]] == list(range(1, steps + 1))
    # every heuristic value is labelled as the formula that computed it: step 1's weights
    # were still valid (its record names Adam, and carries the weighted value when the
    # "auto" cadence had time for it), every later value is the constant-rate formula's
    assert records[0].optimizer is not None
    assert all(r.optimizer is None for r in records[1:] if r.heuristic_epsilon is not None)
    assert final.optimizer is None
    assert ADAPTIVE_HEURISTIC_LABEL not in final.labels()["heuristic_epsilon"]
    q = engine.accountant.history[0][1]
    constant = DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=1.0)
    assert final.heuristic_epsilon == pytest.approx(
        privacy_model("heuristic", constant).epsilon(DELTA), rel=1e-9
    )
