"""Canaries enter the steps the way the loader samples records."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
)
from opacus_lastiterate.callbacks.canary_sampling import CanaryInclusion


def _masks(scheme, steps, m=400, q=0.1, seed=0):
    inclusion = CanaryInclusion(
        m, sample_rate=q, sampling=scheme, generator=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
    )
    return np.stack([inclusion.next_step().numpy() for _ in range(steps)])


def test_shuffled_whole_epochs_each_canary_once_per_epoch() -> None:
    masks = _masks(ShuffledBatches(1000, 100, False), 30)
    per_epoch = masks.reshape(3, 10, -1).sum(axis=1)
    assert (per_epoch == 1).all()


def test_shuffled_step_frequencies_follow_batch_sizes() -> None:
    """N = 250, B = 100: batches 100, 100, 50; over 400 canaries x 200 epochs the step
    counts are multinomial(0.4, 0.4, 0.2) (chi-square, fixed seed)."""
    scheme = ShuffledBatches(250, 100, False)
    masks = _masks(scheme, 3 * 200)
    counts = masks.reshape(200, 3, -1).sum(axis=(0, 2))
    expected = np.array([0.4, 0.4, 0.2]) * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-4


def test_drop_last_drops_the_canary_with_the_dropped_mass() -> None:
    """N = 250, B = 100, drop_last: 2 steps per epoch, a canary is in none with probability
    50 / 250; the fraction over 80,000 canary-epochs is within 5 standard errors."""
    masks = _masks(ShuffledBatches(250, 100, True), 2 * 200)
    per_epoch = masks.reshape(200, 2, -1).sum(axis=1)
    assert per_epoch.max() == 1
    missing = 1 - per_epoch.mean()
    se = np.sqrt(0.2 * 0.8 / per_epoch.size)
    assert abs(missing - 0.2) < 5 * se


def test_balls_in_bins_uniform_step_each_epoch() -> None:
    masks = _masks(BallsInBins(8), 8 * 100)
    per_epoch = masks.reshape(100, 8, -1)
    assert (per_epoch.sum(axis=1) == 1).all()
    counts = per_epoch.sum(axis=(0, 2))
    assert stats.chisquare(counts).pvalue > 1e-4


def test_deterministic_same_step_every_epoch() -> None:
    masks = _masks(DeterministicBatches(1000, 100, False), 30).reshape(3, 10, -1)
    assert (masks[0] == masks[1]).all() and (masks[1] == masks[2]).all()
    assert (masks.sum(axis=1) == 1).all()


@pytest.mark.parametrize("scheme", [None, PoissonSampling(0.1)])
def test_poisson_is_the_coin_per_step_as_before(scheme) -> None:
    """Bit-identical to the former draw: ``torch.rand(m, generator) < q`` per step."""
    masks = _masks(scheme, 5, m=50, q=0.1, seed=3)
    g = torch.Generator().manual_seed(3)
    expected = np.stack([(torch.rand(50, generator=g) < 0.1).numpy() for _ in range(5)])
    assert (masks == expected).all()
