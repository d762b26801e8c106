"""Adaptive runs in the kept model: Adam/AdamW followed through their SGD equivalent, the
other adaptive optimizers from scratch; both against the weights of an independent numpy
Adam with the second moment frozen."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep, SGDEquivalent
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

DELTA = 1e-5
SIGMA, Q, STD = 1.0, 0.05, 0.02


def _numpy_adam(lrs, *, beta1, beta2, eps, weight_decay, decoupled, amsgrad, std):
    """Weights of torch's Adam/AdamW on one coordinate, v_t frozen at its expectation under
    N(0, std^2) gradients: the negated response of the final parameter to a unit gradient at
    each step (p_0 = 0), simulated forward."""
    T = len(lrs)
    v = np.zeros(T)
    acc = 0.0
    for t in range(T):
        acc = beta2 * acc + (1 - beta2) * std**2
        v[t] = acc
    if amsgrad:
        v = np.maximum.accumulate(v)
    out = np.empty(T)
    for impulse in range(T):
        p = m = 0.0
        for t in range(T):
            g = (1.0 if t == impulse else 0.0) + (0.0 if decoupled else weight_decay * p)
            if decoupled:
                p *= 1 - lrs[t] * weight_decay
            m = beta1 * m + (1 - beta1) * g
            p -= lrs[t] * m / (1 - beta1 ** (t + 1)) / (
                math.sqrt(v[t] / (1 - beta2 ** (t + 1))) + eps)
        out[impulse] = -p
    return out


def _schedule(T, warm=5, base=0.05):
    return [base * min((t + 1) / warm, (T - t) / (T - warm)) for t in range(T)]


CASES = [  # (optimizer, weight_decay, amsgrad, eps): the first three map onto SGD
    ("adamw", 0.5, False, 1e-8),
    ("adamw", 0.5, True, 0.03),
    ("adam", 0.0, False, 0.03),
    ("adam", 0.01, False, 1e-8),  # L2 decay: from scratch
]


@pytest.mark.parametrize("name, wd, amsgrad, eps", CASES)
def test_kept_model_of_an_adam_run_matches_a_numpy_adam(name, wd, amsgrad, eps):
    T, beta1, beta2 = 30, 0.8, 0.9
    lrs = _schedule(T)
    # noise that changes mid-run (a second segment): the frozen state follows it
    stds = [STD] * 15 + [2 * STD] * 15
    sigmas = [SIGMA] * 15 + [2 * SIGMA] * 15
    kept = KeptModel()
    for t in range(T):
        st = AdaptiveSettings(name, lrs[t], beta1=beta1, beta2=beta2, eps=eps,
                              weight_decay=wd, amsgrad=amsgrad)
        kept.append(sigmas[t], Q, 1, AdaptiveStep(st, stds[t]))
    # numpy reference with a per-step std
    w = _numpy_adam_per_step(lrs, beta1, beta2, eps, wd, name == "adamw", amsgrad, stds)
    run = DPSGDRun.from_history([(SIGMA, Q, 15), (2 * SIGMA, Q, 15)])
    expected = privacy_model("heuristic", DPSGDRun(run.segments, weights=w)).epsilon(DELTA)
    assert kept.uses_weights
    assert kept.epsilon(DELTA) == pytest.approx(expected, rel=2 * kept.accuracy)
    np.testing.assert_allclose(kept.weights() / kept.weights()[-1], w / w[-1], rtol=1e-9)


def _numpy_adam_per_step(lrs, beta1, beta2, eps, wd, decoupled, amsgrad, stds):
    T = len(lrs)
    v, acc = np.zeros(T), 0.0
    for t in range(T):
        acc = beta2 * acc + (1 - beta2) * stds[t] ** 2
        v[t] = acc
    if amsgrad:
        v = np.maximum.accumulate(v)
    out = np.empty(T)
    for impulse in range(T):
        p = m = 0.0
        for t in range(T):
            g = (1.0 if t == impulse else 0.0) + (0.0 if decoupled else wd * p)
            if decoupled:
                p *= 1 - lrs[t] * wd
            m = beta1 * m + (1 - beta1) * g
            p -= lrs[t] * m / (1 - beta1 ** (t + 1)) / (
                math.sqrt(v[t] / (1 - beta2 ** (t + 1))) + eps)
        out[impulse] = -p
    return out


def test_the_sgd_equivalent_weights_are_proportional_to_adamw():
    T = 40
    lrs = _schedule(T)
    eq = SGDEquivalent()
    sgd = [eq.append(AdaptiveStep(AdaptiveSettings("adamw", lr, beta1=0.9, beta2=0.99,
                                                     weight_decay=1.0), STD)) for lr in lrs]
    assert eq.supported and all(s is not None for s in sgd)
    w_sgd = sgd_weights([s.lr for s in sgd], momentum=0.9)
    w = _numpy_adam(lrs, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=1.0, decoupled=True,
                    amsgrad=False, std=STD)
    np.testing.assert_allclose(w_sgd / w_sgd.sum(), w / w.sum(), rtol=1e-9)


@pytest.mark.parametrize("settings", [
    AdaptiveSettings("adam", 0.01, weight_decay=0.1),  # L2 decay feeds back into m
    AdaptiveSettings("rmsprop", 0.01),
    AdaptiveSettings("radam", 0.01),
])
def test_runs_without_an_sgd_equivalent_are_refused_by_it(settings):
    eq = SGDEquivalent()
    assert eq.append(AdaptiveStep(settings, STD)) is None and not eq.supported


def test_a_new_beta1_ends_the_equivalent_for_good():
    eq = SGDEquivalent()
    assert eq.append(AdaptiveStep(AdaptiveSettings("adam", 0.01, beta1=0.9), STD)) is not None
    assert eq.append(AdaptiveStep(AdaptiveSettings("adam", 0.01, beta1=0.8), STD)) is None
    assert eq.append(AdaptiveStep(AdaptiveSettings("adam", 0.01, beta1=0.9), STD)) is None


def test_adaptive_step_validates():
    with pytest.raises(ValueError, match="noise_std"):
        AdaptiveStep(AdaptiveSettings("adam", 0.01), 0.0)
    with pytest.raises(TypeError, match="settings"):
        AdaptiveStep((0.01,), 1.0)  # type: ignore[arg-type]
