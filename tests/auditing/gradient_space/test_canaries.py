"""craft / insert / score of the gradient canaries on tiny inputs (numpy and torch)."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.auditing import (
    DiracCanary,
    DiracCanaryAdversary,
    PoissonInsertion,
    SimulatedCoordinateAdversary,
)
from opacus_lastiterate.auditing.gradient_space.canaries import (
    RandomDirectionAdversary,
    RandomDirectionCanary,
)
from opacus_lastiterate.auditing.gradient_space.insertion import PeriodicInsertion


def test_dirac_craft_insert_score() -> None:
    canary = DiracCanaryAdversary(clipping_norm=2.0).craft(np.random.default_rng(3), 5)
    assert isinstance(canary, DiracCanary)
    c = canary.coordinate
    assert 0 <= c < 5 and canary.gradient[c] == 2.0 and np.linalg.norm(canary.gradient) == 2.0
    summed = np.ones((3, 5))
    out = canary.insert(summed, np.array([True, False, True]))
    expected = np.ones((3, 5))
    expected[[0, 2], c] += 2.0
    np.testing.assert_array_equal(out, expected)
    theta0, theta_t = np.zeros(5), -np.arange(5.0)
    assert canary.score(theta0, theta_t) == pytest.approx(float(c))
    with pytest.raises(ValueError, match="last axis"):
        canary.insert(np.zeros(4))
    with pytest.raises(ValueError):
        canary.gradient[0] = 1.0  # read-only


def test_dirac_coordinate_is_uniform() -> None:
    rng = np.random.default_rng(0)
    coords = [DiracCanaryAdversary().craft(rng, 4).coordinate for _ in range(400)]
    assert set(coords) == {0, 1, 2, 3}


def test_simulated_coordinate_picks_least_moved() -> None:
    updates = np.array([[1.0, -0.1, 0.5], [-1.0, 0.05, -0.5]])  # coordinate 1 moves least
    canary = SimulatedCoordinateAdversary(clipping_norm=1.5).craft(updates)
    assert canary.coordinate == 1 and canary.gradient[1] == 1.5
    with pytest.raises(ValueError, match="noiseless_updates"):
        SimulatedCoordinateAdversary().craft(np.zeros(3))


def test_random_direction_norm_and_cosine_score() -> None:
    canary = RandomDirectionAdversary(clipping_norm=3.0).craft(np.random.default_rng(1), 7)
    assert isinstance(canary, RandomDirectionCanary)
    assert np.linalg.norm(canary.gradient) == pytest.approx(3.0)
    u = canary.gradient / 3.0
    theta0 = np.zeros(7)
    assert canary.score(theta0, -5.0 * u) == pytest.approx(1.0)
    assert canary.score(theta0, 5.0 * u) == pytest.approx(-1.0)
    assert canary.score(theta0, theta0) == 0.0


def test_torch_insert_and_score() -> None:
    torch = pytest.importorskip("torch")
    canary = DiracCanaryAdversary().craft(np.random.default_rng(2), 4)
    summed = torch.zeros(2, 4, dtype=torch.float32)
    out = canary.insert(summed, torch.tensor([True, False]))
    assert out.dtype == torch.float32 and float(out[0, canary.coordinate]) == 1.0
    assert float(out.sum()) == 1.0
    direction = RandomDirectionAdversary().craft(np.random.default_rng(2), 4)
    u = torch.as_tensor(np.array(direction.gradient), dtype=torch.float64)
    assert float(direction.score(torch.zeros(4, dtype=torch.float64), -u)) == pytest.approx(1.0)


def test_insertion_schedules() -> None:
    rng = np.random.default_rng(0)
    periodic = PeriodicInsertion(period=3, offset=1)
    mask = periodic.mask(rng, 2, 10)
    assert mask[0].tolist() == [t in (1, 4, 7) for t in range(10)]
    assert periodic.count(rng, 2, 10).tolist() == [3, 3]
    assert periodic.count(rng, 1, 1).tolist() == [0]
    counts = PoissonInsertion(0.25).count(rng, 20000, 40)
    # Binomial(40, 0.25): mean 10, sd of the mean sqrt(7.5 / 20000) ~ 0.019.
    assert abs(counts.mean() - 10.0) < 5 * np.sqrt(7.5 / 20000)
    with pytest.raises(ValueError, match="offset"):
        PeriodicInsertion(period=2, offset=2)
    with pytest.raises(ValueError, match="sample_rate"):
        PoissonInsertion(1.5)
    with pytest.raises(TypeError, match="rng"):
        PoissonInsertion(0.5).count(0, 2, 2)  # type: ignore[arg-type]
