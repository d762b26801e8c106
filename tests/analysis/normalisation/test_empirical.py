"""The likelihood-ratio audit estimators on the Gaussian mechanism (delta known in closed form)."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_delta
from opacus_lastiterate.analysis.normalisation.empirical import importance_delta, threshold_delta


def _gaussian_losses(mu: float, trials: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """L = mu x - mu^2 / 2 for N(mu, 1) against N(0, 1), sampled under both."""
    rng = np.random.default_rng(seed)
    up = mu * rng.normal(mu, 1.0, trials) - mu * mu / 2
    low = mu * rng.normal(0.0, 1.0, trials) - mu * mu / 2
    return up, low


def test_bands_cover_the_truth() -> None:
    mu = 1.0
    eps = np.array([0.0, 0.5, 1.0, 2.0])
    truth = np.array([gaussian_delta(mu=mu, epsilon=e) for e in eps])
    up, low = _gaussian_losses(mu, 200_000, 0)
    band = threshold_delta(up, low, eps, confidence=0.999)
    assert np.all(band.lower <= truth) and np.all(truth <= band.upper)
    assert "clopper-pearson" in band.kind
    est = importance_delta(up, eps, z=4.0)
    assert np.all(est.lower <= truth) and np.all(truth <= est.upper)
    assert np.allclose(est.estimate, truth, rtol=0.03)


def test_infinite_losses_count_fully() -> None:
    est = importance_delta(np.array([np.inf, np.inf, -np.inf, 0.0]), [0.0])
    assert est.estimate[0] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: threshold_delta([], [1.0], [0.0]), "losses_upper"),
        (lambda: threshold_delta([1.0], [np.nan], [0.0]), "losses_lower"),
        (lambda: threshold_delta([1.0], [1.0], [np.inf]), "epsilons"),
        (lambda: threshold_delta([1.0], [1.0], [0.0], confidence=1.0), "confidence"),
        (lambda: importance_delta([1.0], [0.0], z=-1.0), "z"),
    ],
)
def test_validation(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
