"""Standard numbers per sampling scheme, the shuffling lower bound, and registry dispatch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.analysis.sampling_heuristic import (
    RobustSamplingHeuristic,
    SamplingHeuristic,
)
from opacus_lastiterate.analysis.sampling_standard import (
    POISSON_ASSUMED_LABEL,
    NoAmplificationBound,
    PoissonAssumed,
    ShuffleLowerBound,
    shuffle_lower_bound_delta,
)


def _run(steps, scheme, sigma=1.0):
    return DPSGDRun.from_history([(sigma, 1.0 / scheme.steps_per_epoch, steps)], sampling=scheme)


def _gaussian_delta(eps, mu):  # Balle and Wang's closed form, written out here
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def test_no_amplification_is_sqrt_epochs_over_sigma() -> None:
    run = _run(25, ShuffledBatches(1000, 100), sigma=1.3)  # 3 epochs, the last partial
    model = NoAmplificationBound(run)
    assert model.mu == pytest.approx(math.sqrt(3) / 1.3, rel=1e-14)
    for eps in (0.5, 2.0):
        assert model.delta(eps) == pytest.approx(_gaussian_delta(eps, math.sqrt(3) / 1.3), rel=1e-9)
    mixed = DPSGDRun.from_history([(2.0, 0.1, 15), (1.0, 0.1, 5)], sampling=BallsInBins(10))
    assert NoAmplificationBound(mixed).mu == pytest.approx(math.sqrt(1 / 4 + 1), rel=1e-14)
    assert "add/remove" in NoAmplificationBound(mixed).label
    assert "zero-out" in NoAmplificationBound(run).label


def test_poisson_assumed_is_the_poisson_number_with_its_label() -> None:
    run = _run(30, ShuffledBatches(1000, 100))
    plain = DPSGDRun.constant(steps=30, sample_rate=0.1, noise_multiplier=1.0)
    assert PoissonAssumed(run).epsilon(1e-5) == StandardComposition(plain).epsilon(1e-5)
    assert PoissonAssumed(run).label == POISSON_ASSUMED_LABEL


def _single_epoch_cube_bound(eps, sigma, k):
    """Chua et al.'s single-epoch bound, by a direct scan over the cube level c."""
    c = np.linspace(-2 * sigma, 2 + 8 * sigma, 20001)
    a = 1 - stats.norm.cdf((c - 2) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    b = 1 - stats.norm.cdf((c - 1) / sigma) * stats.norm.cdf(c / sigma) ** (k - 1)
    return max(0.0, float(np.max(a - math.exp(eps) * b)))


@pytest.mark.parametrize("sigma,k,eps", [(0.5, 10, 1.0), (0.8, 100, 2.0), (1.0, 1000, 0.5)])
def test_one_epoch_lower_bound_is_the_cube_bound(sigma, k, eps) -> None:
    ours = shuffle_lower_bound_delta(eps, noise_multiplier=sigma, steps_per_epoch=k, epochs=1)
    assert ours == pytest.approx(_single_epoch_cube_bound(eps, sigma, k), rel=2e-3, abs=1e-12)


def test_lower_bound_sits_between_poisson_and_the_upper_bound() -> None:
    """The issue's run (3 epochs, N = 1000, B = 100, sigma = 1): the shuffling lower bound
    exceeds the Poisson-assumed number (so the latter is no guarantee) and stays below the
    no-amplification upper bound."""
    run = _run(30, ShuffledBatches(1000, 100))
    lower = ShuffleLowerBound(run).epsilon(1e-5)
    assert PoissonAssumed(run).epsilon(1e-5) < lower <= NoAmplificationBound(run).epsilon(1e-5)
    # more epochs never lower the bound (each epoch's test outcome is one more release)
    deltas = [shuffle_lower_bound_delta(2.0, noise_multiplier=1.0, steps_per_epoch=10, epochs=e)
              for e in (1, 2, 4)]
    assert deltas == sorted(deltas)


def test_registry_dispatches_on_sampling_and_keeps_poisson() -> None:
    shuffled = _run(30, ShuffledBatches(1000, 100))
    assert isinstance(privacy_model("heuristic", shuffled), SamplingHeuristic)
    assert isinstance(privacy_model("robust_heuristic", shuffled), RobustSamplingHeuristic)
    assert isinstance(privacy_model("standard", shuffled), NoAmplificationBound)
    assert isinstance(privacy_model("standard", shuffled, value_discretization_interval=1e-3),
                      NoAmplificationBound)
    assert isinstance(privacy_model("standard_rdp", shuffled), NoAmplificationBound)
    unknown = _run(30, UnknownSampling("WeightedRandomSampler", DeterministicBatches(1000, 100)))
    assert "assumes" in privacy_model("heuristic", unknown).label
    plain = DPSGDRun.constant(steps=30, sample_rate=0.1, noise_multiplier=1.0)
    tagged = DPSGDRun.constant(steps=30, sample_rate=0.1, noise_multiplier=1.0,
                               sampling=PoissonSampling(0.1))
    for name in ("heuristic", "robust_heuristic", "standard", "standard_rdp", "full_batch"):
        assert privacy_model(name, tagged).epsilon(1e-5) == privacy_model(name, plain).epsilon(1e-5)
