"""LastIterateAccountant under torch's adaptive optimizers (Adam, AdamW, ...): the adaptive
heuristic recorded step by step from a real Opacus run, checked against an independent
numpy AdamW with the second moment frozen, driven by unit impulses."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.adaptive_trace import adaptive_trace_as_lists
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning, OptimizerTraceWarning
from tests.analysis._reference import frozen_adamw_weights

DELTA = 1e-5
SIGMA, CLIP = 0.8, 1.0
N, BATCH = 256, 32  # Poisson rate q = 1/8, expected batch size 32
BASE_LR, WARMUP, STEPS = 0.01, 4, 16

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore:Secure RNG turned off:UserWarning",
    "ignore::opacus_lastiterate.exceptions.AdaptiveHeuristicWarning",
)


def _warmup_decay(step: int) -> float:
    """Linear warm-up over WARMUP steps, then linear decay to 0 at STEPS (the multiplier of
    step ``step``, 0-based, as LambdaLR applies it)."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    return max(0.0, (STEPS - step) / (STEPS - WARMUP))


def _train(make_optimizer, steps=STEPS, schedule=True):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(N, 6), torch.randint(0, 3, (N,)))
    model = nn.Linear(6, 3)
    optimizer = make_optimizer(model.parameters())
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(data, batch_size=BATCH),
        noise_multiplier=SIGMA, max_grad_norm=CLIP,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_decay) if schedule else None
    taken = 0
    while taken < steps:
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            if sched is not None:
                sched.step()
            taken += 1
            if taken == steps:
                break
    return engine.accountant


@pytest.mark.parametrize("eps", [1e-8, 0.05])
def test_adamw_with_warmup_and_decay_matches_a_numpy_adamw(eps):
    beta1, beta2, wd = 0.8, 0.95, 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)
        acc = _train(lambda p: torch.optim.AdamW(
            p, lr=BASE_LR, betas=(beta1, beta2), eps=eps, weight_decay=wd))
    assert acc.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert acc.uses_weights
    lrs = [BASE_LR * _warmup_decay(t) for t in range(STEPS)]
    w = frozen_adamw_weights(lrs, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd,
                             noise_std=SIGMA * CLIP / BATCH)
    run = DPSGDRun.constant(steps=STEPS, sample_rate=BATCH / N, noise_multiplier=SIGMA)
    expected = privacy_model("heuristic", DPSGDRun(run.segments, weights=w)).epsilon(DELTA)
    got = acc.get_epsilon(DELTA)
    assert got == pytest.approx(expected, rel=2 * acc.weight_accuracy)
    # the weights matter: the constant-rate formula gives another number
    assert abs(privacy_model("heuristic", run).epsilon(DELTA) - got) > 5 * acc.weight_accuracy * got
    assert ADAPTIVE_HEURISTIC_LABEL in acc.describe()


def test_rmsprop_reads_the_noise_std_of_the_dp_optimizer():
    """RMSprop's state is not bias-corrected: with eps comparable to the noise std sigma C / B
    (0.025 here), the weights lr_t / (sqrt(v_t) + eps) depend on the noise std read from the
    DPOptimizer; checked against a numpy RMSprop with v_t frozen at its expectation."""
    alpha, eps, steps = 0.99, 0.05, 10
    acc = _train(lambda p: torch.optim.RMSprop(p, lr=BASE_LR, alpha=alpha, eps=eps), steps=steps,
                 schedule=False)
    s2, v, w = (SIGMA * CLIP / BATCH) ** 2, 0.0, []
    for t in range(steps):
        v = alpha * v + (1 - alpha) * s2
        w.append(BASE_LR / (math.sqrt(v) + eps))
    run = DPSGDRun.constant(steps=steps, sample_rate=BATCH / N, noise_multiplier=SIGMA)
    expected = privacy_model("heuristic", DPSGDRun(run.segments, weights=w)).epsilon(DELTA)
    assert acc.get_epsilon(DELTA) == pytest.approx(expected, rel=2 * acc.weight_accuracy)
    # with the noise std taken as 1 the weights, and the number, would differ
    v, w1 = 0.0, []
    for t in range(steps):
        v = alpha * v + (1 - alpha)
        w1.append(BASE_LR / (math.sqrt(v) + eps))
    other = privacy_model("heuristic", DPSGDRun(run.segments, weights=w1)).epsilon(DELTA)
    # (each an upper bound within weight_accuracy: a gap over 3x it is the weights)
    assert abs(other - expected) > 3 * acc.weight_accuracy * expected


@pytest.mark.parametrize("make", [
    lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True),
    lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5),
    lambda p: torch.optim.Adagrad(p, lr=0.01),
    lambda p: torch.optim.NAdam(p, lr=0.01),
    lambda p: torch.optim.RAdam(p, lr=0.01),
    lambda p: torch.optim.Adamax(p, lr=0.01),
])
def test_other_adaptive_optimizers_record_without_fallback(make):
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)
        acc = _train(make, steps=6, schedule=False)
    assert len(acc.adaptive_trace) >= 1 and sum(n for _, n in acc.adaptive_trace) == 6
    assert acc.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert math.isfinite(acc.get_epsilon(DELTA))


def test_maximize_is_refused():
    with pytest.raises(ValueError, match="maximize"):
        _train(lambda p: torch.optim.AdamW(p, lr=0.01, maximize=True), steps=1)


def test_caveats_warn_once_per_run():
    acc = _train(lambda p: torch.optim.AdamW(p, lr=0.01), steps=4, schedule=False)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        for _ in range(3):
            acc.get_epsilon(DELTA)
    caveats = [w for w in got if issubclass(w.category, AdaptiveHeuristicWarning)]
    assert len(caveats) == 1
    assert "steps = 4 is outside" in str(caveats[0].message)


def test_adaptive_trace_survives_state_dict():
    acc = _train(lambda p: torch.optim.AdamW(p, lr=BASE_LR, weight_decay=0.1))
    state = acc.state_dict()
    fresh = LastIterateAccountant()
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.adaptive_trace == acc.adaptive_trace
    assert fresh.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert fresh.get_epsilon(DELTA) == acc.get_epsilon(DELTA)
    # a taken-back step trims the trace with the history
    back = LastIterateAccountant()
    back.load_state_dict(state)
    back.take_back(3)
    assert sum(n for _, n in back.adaptive_trace) == STEPS - 3
    assert back.get_epsilon(DELTA) != acc.get_epsilon(DELTA)


def _corrupt(state, field, part, index, value):
    bad = copy.deepcopy(state)
    bad["adaptive_trace"] = adaptive_trace_as_lists(bad["adaptive_trace"])  # to edit
    bad["adaptive_trace"][field][part][index] = value
    return bad


@pytest.mark.parametrize("field, part, index, value, match", [
    ("beta2", "values", 0, 1.5, r"beta2"),
    ("noise_std", "values", 0, -1.0, r"noise_std"),
    ("optimizer", "values", 0, "lbfgs", r"lbfgs"),
    ("lr", "steps", 0, 0, r"adaptive_trace'\]\['lr'\]\['steps'\]\[0\]"),
])
def test_malformed_adaptive_traces_are_refused_whole(field, part, index, value, match):
    acc = _train(lambda p: torch.optim.AdamW(p, lr=BASE_LR))
    state = acc.state_dict()
    fresh = LastIterateAccountant()
    fresh.load_state_dict(state)
    before = (fresh.history, fresh.adaptive_trace, fresh.get_epsilon(DELTA))
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(_corrupt(state, field, part, index, value))
    assert (fresh.history, fresh.adaptive_trace, fresh.get_epsilon(DELTA)) == before


def test_incomplete_adaptive_traces_are_refused():
    acc = _train(lambda p: torch.optim.AdamW(p, lr=BASE_LR))
    state = acc.state_dict()
    fresh = LastIterateAccountant()
    missing = copy.deepcopy(state)
    del missing["adaptive_trace"]["beta1"]
    with pytest.raises(ValueError, match=r"adaptive_trace"):
        fresh.load_state_dict(missing)
    short = copy.deepcopy(state)
    short["adaptive_trace"] = adaptive_trace_as_lists(short["adaptive_trace"])
    for part in short["adaptive_trace"].values():
        part["steps"][-1] -= 1 if part["steps"][-1] > 1 else 0
    with pytest.raises(ValueError, match=r"adaptive_trace"):
        fresh.load_state_dict(short)
    assert fresh.num_steps == 0 and fresh.adaptive_trace == []


def test_distributed_optimizer_noise_std_is_over_the_global_batch():
    """Under Opacus's DistributedDPOptimizer ``expected_batch_size`` is per rank (B / W);
    each rank divides by it and the all-reduce averages over the W ranks, so the noise that
    AdamW sees is sigma C / B with the global B, as in one process with batch B. Built
    without a process group: a single-process DPOptimizer's state in the distributed class."""
    from opacus.optimizers import DistributedDPOptimizer, DPOptimizer

    from opacus_lastiterate.schedules import adaptive_step, dp_noise_std

    world, per_rank = 4, 8.0
    model = nn.Linear(3, 2)
    single = DPOptimizer(torch.optim.AdamW(model.parameters(), lr=0.01), noise_multiplier=SIGMA,
                         max_grad_norm=CLIP, expected_batch_size=int(per_rank * world))
    dist = DistributedDPOptimizer.__new__(DistributedDPOptimizer)
    dist.__dict__.update(copy.copy(single.__dict__))
    dist.expected_batch_size, dist.rank, dist.world_size = per_rank, 1, world
    expected = SIGMA * CLIP / (per_rank * world)  # 0.8 / 32 = 0.025
    assert dp_noise_std(dist) == pytest.approx(expected, rel=1e-15)
    assert dp_noise_std(single) == pytest.approx(expected, rel=1e-15)
    assert adaptive_step(dist) == adaptive_step(single)
    for bad in (0, 2.0, True):
        dist.world_size = bad
        with pytest.raises(ValueError, match="world_size"):
            dp_noise_std(dist)


def test_adam_with_l2_decay_whose_weights_flip_sign_falls_back_with_a_warning():
    """Adam's L2 weight decay with lr * weight_decay above the preconditioner (about
    sigma C / B = 0.025 here) flips the parameter's sign at every step: the frozen-second-
    moment weights are negative, which no heuristic describes. The accountant says so and
    answers with the constant-rate formula, labelled as such, instead of a number for
    weights it cannot use; training is not interrupted."""
    with pytest.warns(OptimizerTraceWarning, match="finite and >= 0"):
        acc = _train(lambda p: torch.optim.Adam(p, lr=0.5, weight_decay=0.2), steps=8,
                     schedule=False)
        eps = acc.get_epsilon(DELTA)
    constant = privacy_model("heuristic", DPSGDRun.constant(steps=8, sample_rate=BATCH / N,
                                                            noise_multiplier=SIGMA))
    assert eps == pytest.approx(constant.epsilon(DELTA), rel=1e-9)
    assert acc.adaptive_optimizer is None and acc.heuristic_label != ADAPTIVE_HEURISTIC_LABEL
    assert acc.settings_unusable
    assert math.isfinite(acc.get_epsilon(DELTA))  # no second warning needed, no error
