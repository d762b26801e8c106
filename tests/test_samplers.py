"""The balls-in-bins batch sampler: each record once per epoch, in a uniform step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.samplers import BallsInBinsBatchSampler, balls_in_bins_data_loader


def test_every_record_exactly_once_per_epoch() -> None:
    sampler = BallsInBinsBatchSampler(257, 10, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        batches = list(sampler)
        assert len(batches) == 10 == len(sampler)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(257))


def test_step_of_a_record_is_uniform_and_independent_across_epochs() -> None:
    """Chi-square test of the step of record 0 over 4,000 epochs (b = 8): uniform, and the
    step pairs of consecutive epochs independent (64 cells). Fixed seed; the test fails for
    a sampler that favours a step (p < 1e-4 rejects)."""
    b, epochs = 8, 4000
    sampler = BallsInBinsBatchSampler(50, b, generator=torch.Generator().manual_seed(7))
    steps = []
    for _ in range(epochs):
        steps.append(next(j for j, batch in enumerate(sampler) if 0 in batch))
    counts = np.bincount(steps, minlength=b)
    assert stats.chisquare(counts).pvalue > 1e-4
    pairs = np.bincount(np.array(steps[:-1]) * b + np.array(steps[1:]), minlength=b * b)
    assert stats.chisquare(pairs).pvalue > 1e-4


def test_batch_sizes_are_binomial() -> None:
    """Batch sizes ~ Binomial(N, 1/b): mean N/b, variance N (1/b)(1-1/b), checked over
    2,000 epochs to 5 standard errors."""
    n, b = 200, 10
    sampler = BallsInBinsBatchSampler(n, b, generator=torch.Generator().manual_seed(3))
    sizes = np.array([len(batch) for _ in range(2000) for batch in sampler], dtype=float)
    p = 1 / b
    mean_se = math.sqrt(n * p * (1 - p) / sizes.size)
    assert abs(sizes.mean() - n * p) < 5 * mean_se
    assert sizes.var() == pytest.approx(n * p * (1 - p), rel=0.1)


def test_ranks_share_the_bins_and_cover_each_batch() -> None:
    world = 3
    samplers = [BallsInBinsBatchSampler(100, 7, num_replicas=world, rank=r, seed=5) for r in range(world)]
    for epoch in (0, 1):
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        for step in range(7):
            union = sorted(i for r in range(world) for i in per_rank[r][step])
            assert len(union) == len(set(union))
            reference = BallsInBinsBatchSampler(100, 7, num_replicas=1, rank=0, seed=5)
            reference.set_epoch(epoch)
            assert union == sorted(list(reference)[step])
    assert samplers[0].expected_batch_size == pytest.approx(100 / 7 / 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dataset_size": 0, "steps_per_epoch": 3}, "dataset_size"),
        ({"dataset_size": 10, "steps_per_epoch": 0}, "steps_per_epoch"),
        ({"dataset_size": 10, "steps_per_epoch": 2, "num_replicas": 2}, "num_replicas"),
        ({"dataset_size": 10, "steps_per_epoch": 2, "num_replicas": 2, "rank": 2}, "rank"),
        ({"dataset_size": 10, "steps_per_epoch": 2, "generator": 3}, "generator"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs: dict, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        BallsInBinsBatchSampler(**kwargs)


def test_data_loader_collates_empty_batches() -> None:
    """With more steps than records some batches are empty; they collate to empty tensors
    of the right shape (as Opacus's DPDataLoader does) instead of failing."""
    ds = TensorDataset(torch.randn(5, 3), torch.arange(5))
    loader = balls_in_bins_data_loader(
        DataLoader(ds, batch_size=1), steps_per_epoch=20, generator=torch.Generator().manual_seed(0)
    )
    shapes = [x.shape for x, _ in loader]
    assert len(shapes) == 20
    assert any(s[0] == 0 for s in shapes) and all(s[1:] == (3,) for s in shapes)
    assert sum(s[0] for s in shapes) == 5


def test_data_loader_rejects_an_iterable_dataset() -> None:
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield torch.zeros(1)

    with pytest.raises(ValueError, match="data_loader"):
        balls_in_bins_data_loader(DataLoader(Stream()))
