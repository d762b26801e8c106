"""Weights of SGD steps in the final model, and the built-in learning-rate schedules.

The reference for the weights is a forward simulation of the linear SGD recursion written
here from the torch.optim.SGD documentation (one impulse gradient per step); the package
computes them with a backward recursion (or ``lfilter``). ``tests/test_schedules.py``
checks the same weights against a real ``torch.optim.SGD``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opacus_lastiterate.analysis.last_iterate import optimizer_weights as ow
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    builtin_schedule,
    check_optimizer_supported,
    constant_schedule,
    cosine_schedule,
    sgd_weights,
    step_schedule,
)
from opacus_lastiterate.exceptions import UnsupportedOptimizerError


def _simulate(
    lrs, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, grads=None, m0=0.0
):
    """Forward torch.optim.SGD on one scalar parameter with the given gradient sequence;
    momentum, dampening and weight decay may be scalars or per-step lists."""
    T = len(lrs)
    per = [x if isinstance(x, list) else [x] * T for x in (momentum, dampening, weight_decay)]
    m, buf = m0, None
    for t, lr in enumerate(lrs):
        beta, damp, wd = per[0][t], per[1][t], per[2][t]
        g = grads[t] + wd * m
        if beta != 0:
            buf = g if buf is None else beta * buf + (1 - damp) * g
            g = g + beta * buf if nesterov else buf
        m = m - lr * g
    return m


def _reference_weights(lrs, **kw):
    T = len(lrs)
    base = _simulate(lrs, grads=[0.0] * T, m0=0.7, **kw)
    return np.array(
        [
            base - _simulate(lrs, grads=[1.0 if s == t else 0.0 for s in range(T)], m0=0.7, **kw)
            for t in range(T)
        ]
    )


@pytest.mark.parametrize("T", [1, 2, 5, 50])
@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.99])
@pytest.mark.parametrize("eta", [1.0, 0.03])
def test_closed_form_of_the_reference_note(T, beta, eta):
    """eta (1 - beta^(T-t+1)) / (1 - beta) at constant eta (``docs/last_iterate.md``,
    "Per-step weights: schedules and momentum")."""
    t = np.arange(1, T + 1)
    note = eta * (1 - beta ** (T - t + 1)) / (1 - beta)
    assert np.allclose(sgd_weights(np.full(T, eta), momentum=beta), note, rtol=1e-12, atol=0)
    assert np.allclose(_reference_weights([eta] * T, momentum=beta), note, rtol=1e-10)


def test_closed_form_limits():
    assert np.allclose(sgd_weights(np.full(4, 2.0), momentum=1.0), [8, 6, 4, 2])


SETTINGS = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, dampening=0.1),
    dict(momentum=0.7, dampening=1.0),
    dict(momentum=0.9, nesterov=True),
    dict(weight_decay=0.05),
    dict(momentum=0.9, weight_decay=0.3),
    dict(momentum=0.6, nesterov=True, weight_decay=0.2),
    dict(momentum=0.8, dampening=0.5, weight_decay=0.1),
    dict(momentum=0.0, dampening=0.5),  # torch ignores dampening without momentum
]


@pytest.mark.parametrize("kw", SETTINGS, ids=str)
def test_weights_match_a_forward_simulation(kw):
    lrs = list(cosine_schedule(0.4, 12, min_learning_rate=0.02))
    assert np.allclose(
        sgd_weights(lrs, **kw), _reference_weights(lrs, **kw), rtol=1e-10, atol=1e-14
    )


@settings(max_examples=40, deadline=None)
@given(
    lrs=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=30),
    beta=st.floats(0.0, 0.99),
    d=st.floats(0.0, 1.0),
    nesterov=st.booleans(),
)
def test_backward_recursion_equals_adjoint_and_simulation(lrs, beta, d, nesterov):
    if nesterov and beta == 0.0:
        beta = 0.5
    if nesterov:
        d = 0.0
    n = len(lrs)
    fast = sgd_weights(lrs, momentum=beta, dampening=d, nesterov=nesterov)
    lr = np.asarray(lrs, float)
    adjoint = ow._adjoint_weights(lr, np.full(n, beta), np.full(n, d), nesterov, np.zeros(n))
    ref = _reference_weights(lrs, momentum=beta, dampening=d, nesterov=nesterov)
    assert np.allclose(fast, adjoint, rtol=1e-9, atol=1e-12)
    assert np.allclose(fast, ref, rtol=1e-9, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(0.0, 1.0),
            st.sampled_from([0.0, 0.5, 0.9, 0.95]),
            st.floats(0.0, 1.0),
            st.sampled_from([0.0, 0.01, 0.3]),
        ),
        min_size=1,
        max_size=25,
    ),
    nesterov=st.booleans(),
)
def test_per_step_momentum_dampening_and_decay(steps, nesterov):
    """E.g. OneCycleLR cycles the momentum; a step with momentum 0 leaves the buffer alone."""
    lrs, beta, d, wd = (list(x) for x in zip(*steps, strict=True))
    if nesterov:
        beta = [b or 0.5 for b in beta]
        d = [0.0] * len(d)
    ours = sgd_weights(lrs, momentum=beta, dampening=d, nesterov=nesterov, weight_decay=wd)
    ref = _reference_weights(lrs, momentum=beta, dampening=d, nesterov=nesterov, weight_decay=wd)
    assert np.allclose(ours, ref, rtol=1e-9, atol=1e-12)


def test_weight_decay_without_momentum_is_the_quadratic_regulariser():
    """m_t = (1 - eta lambda) m_{t-1} - eta g_t: step t is damped by (1 - eta lambda)^(T - t)."""
    eta, lam, T = 0.5, 0.4, 7
    expected = eta * (1 - eta * lam) ** np.arange(T - 1, -1, -1)
    assert np.allclose(sgd_weights(np.full(T, eta), weight_decay=lam), expected, rtol=1e-12)


def test_plain_sgd_weights_are_the_rates():
    lrs = step_schedule(0.1, 10, step_size=3, gamma=0.5)
    assert np.array_equal(sgd_weights(lrs), lrs)
    assert sgd_weights([]).size == 0


# -- schedules -------------------------------------------------------------------------------


def test_builtin_schedules():
    assert np.array_equal(constant_schedule(0.2, 4), [0.2] * 4)
    assert np.allclose(
        step_schedule(1.0, 7, step_size=3, gamma=0.1), [1, 1, 1, 0.1, 0.1, 0.1, 0.01]
    )
    cos = cosine_schedule(1.0, 4)
    assert np.allclose(
        cos, [1.0, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2]
    )
    cos = cosine_schedule(1.0, 5, min_learning_rate=0.1, period=2)
    assert np.allclose(cos, [1.0, 0.55, 0.1, 0.55, 1.0])
    assert np.array_equal(builtin_schedule("cosine", 1.0, 4), cosine_schedule(1.0, 4))
    assert np.array_equal(
        builtin_schedule("step", 1.0, 7, step_size=3), step_schedule(1.0, 7, step_size=3)
    )
    with pytest.raises(
        ValueError, match="`name` must be one of constant, step, cosine, got 'linear'"
    ):
        builtin_schedule("linear", 1.0, 4)


# -- optimiser names -------------------------------------------------------------------------


class SGD:  # stands in for torch.optim.SGD without importing torch
    pass


class Adam:
    pass


class DPOptimizer:
    def __init__(self, inner):
        self.original_optimizer = inner


@pytest.mark.parametrize("opt", ["SGD", "sgd", "DPSGD", SGD, SGD(), DPOptimizer(SGD())])
def test_sgd_is_supported(opt):
    assert check_optimizer_supported(opt) == "sgd"


@pytest.mark.parametrize(
    "opt", ["Adam", "AdamW", "adagrad", "RMSprop", "DPAdam", Adam, DPOptimizer(Adam())]
)
def test_adaptive_optimisers_raise(opt):
    with pytest.raises(UnsupportedOptimizerError, match="adaptive.*SGD's weights do not apply.*adaptive_weights"):
        check_optimizer_supported(opt)


def test_unknown_optimiser_raises():
    with pytest.raises(UnsupportedOptimizerError, match="'Foo' is not known"):
        check_optimizer_supported("Foo")
    assert issubclass(UnsupportedOptimizerError, ValueError)


# -- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (
            dict(learning_rates=[0.1, -0.1]),
            ValueError,
            r"`learning_rates\[1\]` must be in \[0, inf\), got -0\.1",
        ),
        (
            dict(learning_rates=[[0.1]]),
            ValueError,
            "`learning_rates` must be a one-dimensional sequence",
        ),
        (dict(learning_rates="0.1"), TypeError, "`learning_rates`"),
        (dict(momentum=1.5), ValueError, r"`momentum` must be in \[0, 1\], got 1\.5"),
        (dict(momentum=-0.1), ValueError, "`momentum`"),
        (dict(dampening=2.0), ValueError, "`dampening`"),
        (dict(weight_decay=-1.0), ValueError, "`weight_decay`"),
        (dict(nesterov=True), ValueError, "`nesterov` requires momentum > 0"),
        (dict(nesterov=True, momentum=0.9, dampening=0.1), ValueError, "dampening == 0"),
        (dict(nesterov="yes", momentum=0.9), TypeError, "`nesterov`"),
        (dict(momentum=[0.9, 1.2]), ValueError, r"`momentum\[1\]` must be in \[0, 1\], got 1\.2"),
        (
            dict(momentum=[0.9]),
            ValueError,
            r"`momentum` must be a scalar or have one entry per step \(2\)",
        ),
        (dict(weight_decay=[0.0, -1.0]), ValueError, r"`weight_decay\[1\]`"),
    ],
)
def test_bad_input(kwargs, exc, pattern):
    kw = dict(learning_rates=[0.1, 0.1]) | kwargs
    lrs = kw.pop("learning_rates")
    with pytest.raises(exc, match=pattern):
        sgd_weights(lrs, **kw)


def test_bad_schedule_input():
    with pytest.raises(ValueError, match="`step_size`"):
        step_schedule(0.1, 10, step_size=0)
    with pytest.raises(ValueError, match="`learning_rate`"):
        cosine_schedule(0.0, 10)
    with pytest.raises(ValueError, match="`min_learning_rate`"):
        cosine_schedule(0.1, 10, min_learning_rate=0.2)
    with pytest.raises(TypeError, match="`steps`"):
        constant_schedule(0.1, 2.5)


@pytest.mark.parametrize("beta, damp, nesterov", [(0.9, 0.0, False), (0.8, 0.3, False),
                                                  (0.9, 0.0, True), (0.0, 0.0, False)])  # fmt: skip
def test_heavy_ball_recursion_matches_the_adjoint_weights_and_their_growth(beta, damp, nesterov):
    """HeavyBallRecursion's weights equal those of the general (adjoint) recursion, which
    sgd_weights uses for per-step momentum (a momentum that varies by 1e-300 takes it), and
    its growth coefficients give the weights after more steps: w_t(T') = w_t(T) + c_t
    R_{T+1}(T')."""
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import HeavyBallRecursion

    rng = np.random.default_rng(3)
    eta = rng.uniform(0.01, 0.5, 60)
    rec = HeavyBallRecursion(beta, damp, nesterov)
    w = rec.weights(0, rec.discounted_rates(eta), eta)
    wd = np.zeros(60)
    wd[7] = 1e-300  # forces the general recursion without changing the weights
    general = sgd_weights(eta, momentum=beta, dampening=damp, nesterov=nesterov, weight_decay=wd)
    np.testing.assert_allclose(w, general, rtol=1e-12, atol=0)
    t_mid = 45
    w_mid = rec.weights(0, rec.discounted_rates(eta[:t_mid]), eta[:t_mid])
    r_next = rec.discounted_rates(eta[t_mid:])[0]
    grown = w_mid + rec.growth(0, t_mid, t_mid) * r_next
    np.testing.assert_allclose(grown, w[:t_mid], rtol=1e-12, atol=1e-300)
