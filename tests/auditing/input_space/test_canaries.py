"""Input canaries: construction, equality, and scores checked against hand computations."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch import nn

from opacus_lastiterate.auditing import (
    InputCanary,
    InputScore,
    blank_canary,
    clip_backdoor_canary,
    in_distribution_canary,
    least_likely_label,
    mislabelled_canary,
)
from opacus_lastiterate.auditing.input_space.canaries import sample_scores


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Module:
    model = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight, dtype=torch.float32))
        model.bias.copy_(torch.tensor(bias, dtype=torch.float32))
    return model


def test_real_example_canaries() -> None:
    x = torch.arange(12.0).reshape(4, 3)
    y = torch.tensor([0, 1, 2, 1])
    c = in_distribution_canary(x, y, 2)
    assert c.kind == "in-distribution" and c.label == 2
    torch.testing.assert_close(c.features, x[2])
    m = mislabelled_canary(x, y, 2, num_classes=3)
    assert m.kind == "mislabelled" and m.label == 0  # (2 + 1) mod 3
    assert mislabelled_canary(x, y, 1, num_classes=3, shift=2).label == 0
    with pytest.raises(ValueError, match="shift"):
        mislabelled_canary(x, y, 1, num_classes=3, shift=3)
    with pytest.raises(ValueError, match="index"):
        in_distribution_canary(x, y, 4)
    with pytest.raises(ValueError, match="labels"):
        in_distribution_canary(x, y[:3], 0)
    x[2] = -1.0  # the canary holds its own copy
    assert float(c.features[0]) == 6.0


def test_blank_canary_and_validation() -> None:
    b = blank_canary((1, 8, 8), 3)
    assert b.kind == "blank" and b.label == 3 and b.features.shape == (1, 8, 8)
    assert float(b.features.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="shape"):
        blank_canary((0,), 1)
    with pytest.raises(ValueError, match="finite"):
        InputCanary(torch.tensor([float("nan")]), 0)
    with pytest.raises(ValueError, match="label"):
        InputCanary(torch.zeros(2), -1)
    with pytest.raises(ValueError, match="kind"):
        InputCanary(torch.zeros(2), 0, "other")  # type: ignore[arg-type]


def test_clip_backdoor_is_the_least_variance_direction() -> None:
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    data = (rng.standard_normal((800, 4)) * np.array([3.0, 2.0, 1.0, 0.1])) @ q.T + 5.0
    c = clip_backdoor_canary(torch.tensor(data), label=1)
    v = c.features.double().numpy()
    # independent: eigenvector of the smallest eigenvalue of the sample covariance
    _, vecs = np.linalg.eigh(np.cov(data.T))
    assert abs(v @ vecs[:, 0]) / np.linalg.norm(v) == pytest.approx(1.0, abs=1e-6)
    assert np.linalg.norm(v) == pytest.approx(np.linalg.norm(data, axis=1).mean(), rel=1e-5)
    assert abs(v @ q[:, 3]) / np.linalg.norm(v) > 0.999  # the direction that was given 0.1
    scaled = clip_backdoor_canary(torch.tensor(data), label=1, norm=2.0)
    assert float(scaled.features.norm()) == pytest.approx(2.0, rel=1e-6)
    # fewer examples than dimensions: a direction with no variance at all
    few = clip_backdoor_canary(torch.tensor(data[:2]), label=0, norm=1.0).features.double()
    centred = data[:2] - data[:2].mean(0)
    assert np.abs(centred @ few.numpy()).max() < 1e-6


def test_equality_hash_repr_and_pickle() -> None:
    a = InputCanary(torch.tensor([1.0, 2.0]), 1)
    b = InputCanary(np.array([1.0, 2.0], dtype=np.float32), 1)
    c = InputCanary(torch.tensor([1.0, 2.5]), 1)
    assert a == b and hash(a) == hash(b) and a != c
    assert a.digest in repr(a) and a.digest != c.digest
    assert pickle.loads(pickle.dumps(a)) == a
    score = InputScore(a, "margin")
    assert pickle.loads(pickle.dumps(score)) == score
    assert repr(score) != repr(InputScore(c, "margin"))  # run records tell them apart


def test_scores_match_hand_computation() -> None:
    w = np.array([[1.0, -2.0], [0.5, 0.0], [-1.0, 3.0]])
    bias = np.array([0.1, -0.2, 0.3])
    model = _linear(w, bias)
    x = np.array([0.7, -0.4])
    canary = InputCanary(torch.tensor(x), 1)
    z = w @ x + bias
    log_softmax = z - np.log(np.exp(z).sum())
    assert canary.score(model, "loss") == pytest.approx(log_softmax[1], rel=1e-6)
    assert InputScore(canary)(model) == pytest.approx(log_softmax[1], rel=1e-6)
    assert InputScore(canary, "margin")(model) == pytest.approx(z[1] - max(z[0], z[2]), rel=1e-6)
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    torch.testing.assert_close(
        sample_scores(logits, torch.tensor([0, 1]), "margin"), torch.tensor([1.0, -5.0])
    )
    model.train()
    canary.score(model)
    assert model.training  # the mode is restored
    with pytest.raises(ValueError, match="statistic"):
        canary.score(model, "auc")  # type: ignore[arg-type]


def test_least_likely_label() -> None:
    model = _linear(np.array([[1.0], [-3.0], [2.0]]), np.zeros(3))
    assert least_likely_label(model, torch.tensor([1.0])) == 1
    assert least_likely_label(model, torch.tensor([-1.0])) == 2
