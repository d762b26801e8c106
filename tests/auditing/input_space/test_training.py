"""OpacusInputTrainer (digits, input canary) and the worst-case initialisation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from opacus_lastiterate.auditing import (
    InputCanary,
    OpacusInputTrainer,
    digits_data,
    in_distribution_canary,
    mislabelled_canary,
)
from opacus_lastiterate.auditing.input_space.worst_case_init import (
    canary_gradient_norm,
    worst_case_initialisation,
)

X, Y = digits_data()


def _canary(index: int = 5) -> InputCanary:
    return in_distribution_canary(X, Y, index)


def _independent_grad_norm(model: nn.Module, canary: InputCanary) -> float:
    model.zero_grad()
    x, y = canary.batch()
    nn.functional.cross_entropy(model(x), y).backward()
    return float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters())))


def test_data_split_and_sampling_constants() -> None:
    canary = _canary()
    t = OpacusInputTrainer(canary=canary, num_examples=150)
    idx = t.training_indices()
    assert len(idx) == len(set(idx.tolist())) == 150
    assert not np.any(np.all(X[idx].numpy() == canary.features.numpy(), axis=1))
    assert t.sample_rate == 1.0 and t.expected_batch_size == 150
    wc = dataclasses.replace(t, initialisation="worst-case", init_examples=100)
    assert not set(wc.init_indices().tolist()) & set(idx.tolist())
    mb = dataclasses.replace(t, batch_size=40)
    assert mb.sample_rate == 0.25 and mb.expected_batch_size == 37
    with pytest.raises(ValueError, match="not divisible"):
        dataclasses.replace(t, batch_size=50)
    with pytest.raises(ValueError, match="64 features"):
        OpacusInputTrainer(canary=InputCanary(torch.zeros(3), 0))
    with pytest.raises(ValueError, match="initialisation"):
        dataclasses.replace(t, initialisation="zeros")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most"):
        dataclasses.replace(t, num_examples=1797)


@pytest.mark.parametrize("architecture", ["mlp", "cnn"])
def test_training_is_seeded_and_the_canary_matters(architecture: str) -> None:
    canary = mislabelled_canary(X, Y, 5, num_classes=10)
    t = OpacusInputTrainer(canary=canary, architecture=architecture, hidden=4, steps=3,
                           num_examples=60, noise_multiplier=0.5, learning_rate=1.0)
    a, b = t(True, 11), t(True, 11)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    # same seed, without the canary: the noise is the same, so only the canary differs
    c = t(False, 11)
    diff = sum(float((p - q).detach().abs().sum()) for p, q in zip(a.parameters(), c.parameters(),
                                                          strict=True))
    assert diff > 0.0
    init = t.initial_model()
    moved = sum(float((p - q).detach().abs().sum()) for p, q in zip(a.parameters(), init.parameters(),
                                                           strict=True))
    assert moved > 0.0
    assert t.standard_epsilon(1e-5) >= t.heuristic_epsilon(1e-5) > 0.0


def test_initialisations() -> None:
    canary = _canary()
    t = OpacusInputTrainer(canary=canary, num_examples=100, init_examples=200, init_steps=150,
                           hidden=16)
    random = t.initial_model()
    for p, q in zip(random.parameters(), t.random_initial_model().parameters(), strict=True):
        torch.testing.assert_close(p, q)
    wc_trainer = dataclasses.replace(t, initialisation="worst-case")
    wc = wc_trainer.initial_model()
    assert any(not torch.equal(p, q) for p, q in zip(wc.parameters(), random.parameters(),
                                                     strict=True))
    # the same in every call (fixed initialisation)
    for p, q in zip(wc.parameters(), wc_trainer.initial_model().parameters(), strict=True):
        torch.testing.assert_close(p, q)
    # clean data fitted (small loss on digits outside D), canary's gradient kept >= C
    idx = wc_trainer.init_indices()
    with torch.no_grad():
        clean_random = float(nn.functional.cross_entropy(random(X[idx]), Y[idx]))
        clean_wc = float(nn.functional.cross_entropy(wc(X[idx]), Y[idx]))
    assert clean_wc < 0.5 * clean_random
    assert _independent_grad_norm(wc, canary) >= 0.99 * t.max_grad_norm
    assert float(canary_gradient_norm(wc, canary)) == pytest.approx(
        _independent_grad_norm(wc, canary), rel=1e-5
    )


def test_worst_case_initialisation_keeps_the_canary_gradient() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 10))
    before = [p.detach().clone() for p in model.parameters()]
    canary = _canary(7)
    out = worst_case_initialisation(model, X[:300], Y[:300], canary, clipping_norm=2.0,
                                    steps=200)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert _independent_grad_norm(out, canary) >= 0.99 * 2.0
    # without the hinge the same pre-training fits the (in-distribution) canary too
    fitted = worst_case_initialisation(model, X[:300], Y[:300], canary, clipping_norm=2.0,
                                       steps=200, weight=1e-9)
    assert _independent_grad_norm(fitted, canary) < _independent_grad_norm(out, canary)
    with pytest.raises(ValueError, match="labels"):
        worst_case_initialisation(model, X[:3], Y[:2], canary, clipping_norm=1.0)
