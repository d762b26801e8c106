"""Torch side of issue 5: learning rates from real schedulers, SGD settings from real
optimisers, and the weights against a real ``torch.optim.SGD`` run (by linearity: the final
parameter is affine in the gradient sequence, so w_t = m_T(0) - m_T(e_t))."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    cosine_schedule,
    sgd_weights,
    step_schedule,
)
from opacus_lastiterate.exceptions import UnsupportedOptimizerError
from opacus_lastiterate.schedules import (
    SGDSettings,
    record_schedule,
    sgd_settings,
)


def sgd_weights_from_torch(optimizer, steps, *, make_scheduler=None):
    """Per-step weights from the package's pieces: the optimiser's settings
    (:func:`sgd_settings`), the scheduler's rates and momenta (:func:`record_schedule`) and
    :func:`sgd_weights`."""
    s = sgd_settings(optimizer)
    if make_scheduler is None:
        return s.weights(np.full(steps, s.lr))
    rec = record_schedule(make_scheduler, steps, lr=s.lr, momentum=s.momentum)
    return sgd_weights(rec.learning_rates, momentum=rec.momenta, dampening=s.dampening,
                       nesterov=s.nesterov, weight_decay=s.weight_decay)


def _torch_weights(make_scheduler, steps, lr, **sgd_kwargs):
    def run(impulse):
        p = torch.nn.Parameter(torch.tensor(0.25, dtype=torch.float64))
        opt = torch.optim.SGD([p], lr=lr, **sgd_kwargs)
        sched = make_scheduler(opt) if make_scheduler else None
        for t in range(steps):
            p.grad = torch.tensor(1.0 if t == impulse else 0.0, dtype=torch.float64)
            opt.step()
            if sched is not None:
                sched.step()
        return p.item()

    base = run(-1)
    return np.array([base - run(t) for t in range(steps)])


def test_cosine_and_step_schedulers_match_the_builtins():
    cos = record_schedule(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=50, eta_min=0.001), 50, lr=0.1
    ).learning_rates
    assert np.allclose(
        cos, cosine_schedule(0.1, 50, min_learning_rate=0.001), rtol=1e-12, atol=1e-15
    )
    step = record_schedule(
        lambda o: torch.optim.lr_scheduler.StepLR(o, 7, gamma=0.5), 30, lr=0.2
    ).learning_rates
    assert np.allclose(step, step_schedule(0.2, 30, step_size=7, gamma=0.5), rtol=1e-12)


def test_per_epoch_interval_and_lambda_warmup():
    rates = record_schedule(
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: min(1.0, (e + 1) / 3)),
        12,
        lr=0.3,
        interval=4,
    ).learning_rates
    assert np.allclose(rates, np.repeat([0.1, 0.2, 0.3], 4))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(momentum=0.9),
        dict(momentum=0.9, dampening=0.2),
        dict(momentum=0.8, nesterov=True),
        dict(momentum=0.9, weight_decay=0.05),
        dict(weight_decay=0.3),
    ],
    ids=str,
)
def test_weights_match_a_real_torch_sgd_run(kwargs):
    def make(o):
        return torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10)

    expected = _torch_weights(make, 10, 0.3, **kwargs)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.3, **kwargs)
    ours = sgd_weights_from_torch(opt, 10, make_scheduler=make)
    assert np.allclose(ours, expected, rtol=1e-10, atol=1e-14)


def test_constant_rate_momentum_is_the_closed_form():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.05, momentum=0.9)
    ours = sgd_weights_from_torch(opt, 25)
    t = np.arange(25, 0, -1)  # T - t + 1: eta (1 - beta^(T-t+1)) / (1 - beta)
    assert np.allclose(ours, 0.05 * (1 - 0.9**t) / (1 - 0.9), rtol=1e-12)
    assert np.allclose(ours, _torch_weights(None, 25, 0.05, momentum=0.9), rtol=1e-10)


def test_settings_are_read_through_an_opacus_dp_optimizer():
    from opacus.optimizers import DPOptimizer

    inner = torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(2))],
        lr=0.02,
        momentum=0.5,
        dampening=0.1,
        weight_decay=1e-4,
    )
    dp = DPOptimizer(inner, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=8)
    s = sgd_settings(dp)
    assert s == SGDSettings(lr=0.02, momentum=0.5, dampening=0.1, nesterov=False, weight_decay=1e-4)
    assert np.allclose(
        s.weights([0.02] * 5),
        sgd_weights([0.02] * 5, momentum=0.5, dampening=0.1, weight_decay=1e-4),
    )


@pytest.mark.parametrize(
    "cls", [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop]
)
def test_adaptive_optimisers_raise(cls):
    opt = cls([torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    with pytest.raises(UnsupportedOptimizerError, match="adaptive"):
        sgd_settings(opt)
    with pytest.raises(UnsupportedOptimizerError, match=cls.__name__):
        sgd_weights_from_torch(opt, 10)


def test_parameter_groups_that_differ_must_be_chosen():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "momentum": 0.9}], lr=0.1)
    with pytest.raises(ValueError, match="`group=`"):
        sgd_settings(opt)
    assert sgd_settings(opt, group=1).momentum == 0.9
    with pytest.raises(ValueError, match="`group`"):
        sgd_settings(opt, group=2)


def test_the_users_optimizer_is_not_touched():
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sgd_weights_from_torch(
        opt, 5, make_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)
    )
    assert opt.param_groups[0]["lr"] == 0.1 and not opt.state and p.item() == 1.0


def test_one_cycle_schedule_with_cycled_momentum_matches_torch():
    def make(o):
        return torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.5, total_steps=16)

    expected = _torch_weights(make, 16, 0.05, momentum=0.9, dampening=0.1)
    opt = torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(1))], lr=0.05, momentum=0.9, dampening=0.1
    )
    rec = record_schedule(make, 16, lr=0.05, momentum=0.9)
    assert np.ptp(rec.momenta) > 0.05  # the momentum really is cycled
    ours = sgd_weights_from_torch(opt, 16, make_scheduler=make)
    assert np.allclose(ours, expected, rtol=1e-10, atol=1e-14)
