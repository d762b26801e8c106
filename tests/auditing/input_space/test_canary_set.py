"""A set of input canaries with fair coins (the one-run input-space canaries): drawn from a
held-out source, relabelled to a wrong class, appended to the training set by their coins."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from opacus_lastiterate.auditing.input_space import (
    InputCanaries,
    InputCanary,
    InputScore,
    make_input_canaries,
)
from opacus_lastiterate.auditing.input_space.canary_set import fair_coins


def _classification_sets(n: int = 120, held_out: int = 60) -> tuple[TensorDataset, TensorDataset]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n + held_out, 8, generator=g)
    y = torch.randint(0, 3, (n + held_out,), generator=g)
    return TensorDataset(x[:n], y[:n]), TensorDataset(x[n:], y[n:])


def test_make_input_canaries_records_coins_and_wrong_labels() -> None:
    train, source = _classification_sets()
    augmented, canaries = make_input_canaries(train, source, 40, num_classes=3, seed=5)
    assert isinstance(canaries, InputCanaries) and canaries.num_canaries == 40
    assert len(augmented) == len(train) + int(canaries.included.sum())  # type: ignore[arg-type]
    assert 0 < canaries.included.sum() < 40
    true_labels = source.tensors[1][torch.from_numpy(canaries.source_indices)]
    assert torch.all(canaries.labels != true_labels)
    assert torch.equal(canaries.features, source.tensors[0][torch.from_numpy(canaries.source_indices)])
    # the included canaries are appended in order, after the training set
    inc = np.flatnonzero(canaries.included)
    x_last, y_last = augmented[len(augmented) - 1]  # type: ignore[arg-type]
    assert torch.equal(x_last, canaries.features[inc[-1]]) and int(y_last) == int(canaries.labels[inc[-1]])
    # deterministic in the seed, and without touching the global RNG
    state = torch.get_rng_state()
    _, again = make_input_canaries(train, source, 40, num_classes=3, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    assert np.array_equal(again.included, canaries.included)
    assert np.array_equal(again.source_indices, canaries.source_indices)


def test_make_input_canaries_argument_checks() -> None:
    train, source = _classification_sets()
    with pytest.raises(ValueError, match="`num_canaries`"):
        make_input_canaries(train, source, 61, num_classes=3, seed=0)
    with pytest.raises(ValueError, match="`num_classes`"):
        make_input_canaries(train, source, 5, num_classes=1, seed=0)


def test_fair_coins_are_the_seeded_draws() -> None:
    rng = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(2,)))
    assert np.array_equal(fair_coins(7, 50, salt=2), rng.random(50) < 0.5)
    with pytest.raises(ValueError, match="`seed`"):
        fair_coins(-1, 5, salt=0)


def test_each_canary_is_an_input_canary_scored_alike() -> None:
    """The set's batched score is the loss statistic of the single canary (one concept)."""
    train, source = _classification_sets()
    _, canaries = make_input_canaries(train, source, 10, num_classes=3, seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    batched = canaries.scores(model, batch_size=4)
    for i in range(canaries.num_canaries):
        canary = canaries.canary(i)
        assert isinstance(canary, InputCanary) and canary.kind == "mislabelled"
        assert canary.label == int(canaries.labels[i])
        assert batched[i] == pytest.approx(InputScore(canary, "loss")(model), rel=1e-6)
    with pytest.raises(ValueError, match="`index`"):
        canaries.canary(10)
    assert isinstance(canaries, InputCanaries)
