"""The test-only reference computations agree with each other (each is written from the
definition, independently of the package)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.analysis._reference import (
    ClosedFormMixture,
    QuadratureHeuristic,
    enumerate_weighted_shifts,
    gaussian_mechanism_epsilon,
    torch_sgd_weights,
    weighted_heuristic_quadrature,
)

pytestmark = pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")


@pytest.mark.parametrize("steps,q,sigma,delta", [(3, 0.1, 1.0, 1e-6), (200, 0.02, 0.7, 1e-5)])
def test_closed_form_equals_quadrature(steps: int, q: float, sigma: float, delta: float) -> None:
    closed = ClosedFormMixture.binomial(steps, q, sigma).epsilon(delta)
    assert closed == pytest.approx(QuadratureHeuristic(steps, q, sigma).epsilon(delta), rel=1e-9)


def test_closed_form_weighted_equals_quadrature() -> None:
    w, q, sigma = np.array([1.0, 0.3, 0.7, 0.05]), 0.3, 1.1
    x, p = enumerate_weighted_shifts(w, q)
    closed = ClosedFormMixture(x, p, sigma * math.sqrt(float(np.sum(w**2)))).epsilon(1e-6)
    assert closed == pytest.approx(weighted_heuristic_quadrature(w, q, sigma, 1e-6), rel=1e-9)


@pytest.mark.parametrize("mu", [0.3, 1.0, 4.0])
def test_one_sure_shift_is_the_gaussian_mechanism(mu: float) -> None:
    assert ClosedFormMixture([1.0], [1.0], 1 / mu).epsilon(1e-6) == pytest.approx(
        gaussian_mechanism_epsilon(mu, 1e-6), rel=1e-9
    )


def test_torch_sgd_weights_heavy_ball_closed_form() -> None:
    pytest.importorskip("torch")  # torch_sgd_weights runs torch's SGD
    lr, beta, steps = 0.1, 0.9, 6
    t = np.arange(1, steps + 1)
    expected = lr * (1 - beta ** (steps - t + 1)) / (1 - beta)
    np.testing.assert_allclose(torch_sgd_weights([lr] * steps, beta), expected, rtol=1e-12)
    decay = torch_sgd_weights([1.0] * 4, weight_decay=0.5)
    np.testing.assert_allclose(decay, 0.5 ** np.arange(3, -1, -1), rtol=1e-12)
