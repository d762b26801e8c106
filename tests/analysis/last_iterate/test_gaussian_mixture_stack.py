"""The stacked warm solve against the one-pair solve of each lane (itself checked against
mpmath and dp_accounting in test_gaussian_mixture.py and test_heuristic.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    binomial_count,
    binomial_count_stack,
)
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture_stack import MixtureStack
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair

# Both paths stop Newton at a step <= 1e-9 (1 + |y|) (error about 1e-18) or at the root
# finder's 1e-14 (1 + |y|) tolerance; epsilon then agrees to about 1e-13 relative.
REL = 1e-12


def _stack(sigma: float, q: float, steps: np.ndarray) -> tuple[MixtureStack, list]:
    offset, log_pmf, dropped = binomial_count_stack(steps, q)
    stack = MixtureStack(offset, log_pmf, sigma * np.sqrt(steps.astype(float)), dropped)
    pairs = [count_pair(binomial_count(int(n), q), sigma * sigma * float(n)) for n in steps]
    return stack, pairs


@pytest.mark.parametrize(
    "sigma,q,first,delta",
    [(1.0, 0.045, 3, 1e-5), (0.6, 0.01, 500, 1e-6), (2.0, 0.2, 50, 1e-5),
     (5.0, 0.01, 1000, 1e-5), (0.8, 0.001, 20_000, 1e-8)],
)  # fmt: skip
@pytest.mark.parametrize("perturbation", [0.0, 1e-6, 1e-2])
def test_solved_lanes_equal_the_one_pair_epsilon(sigma, q, first, delta, perturbation):
    steps = np.arange(first, first + 40)
    stack, pairs = _stack(sigma, q, steps)
    exact = [p.epsilon_warm(delta, None) for p in pairs]
    rng = np.random.default_rng(0)
    jitter = 1.0 + perturbation * rng.standard_normal((2, steps.size))
    y_pq = np.array([h[1][1] for h in exact]) * jitter[0]
    y_qp = np.array([h[1][2] for h in exact]) * jitter[1]
    got = stack.epsilons(delta, y_pq, y_qp)
    want = np.array([e for e, _ in exact])
    assert got.solved.sum() >= 0.9 * steps.size  # warm starts this close converge
    np.testing.assert_allclose(got.epsilon[got.solved], want[got.solved], rtol=REL)
    assert np.all(np.isnan(got.epsilon[~got.solved]))
    # the thresholds returned are the roots: they warm-start the next solve at once
    again = stack.epsilons(delta, got.y_pq, got.y_qp)
    np.testing.assert_allclose(again.epsilon[got.solved], want[got.solved], rtol=REL)


def test_lanes_the_warm_path_cannot_take_are_left_unsolved():
    steps = np.arange(100, 110)
    stack, pairs = _stack(1.0, 0.05, steps)
    exact = [p.epsilon_warm(1e-5, None)[1] for p in pairs]
    y_pq = np.array([h[1] for h in exact])
    y_qp = np.array([h[2] for h in exact])
    y_pq[2] = math.nan  # no warm start
    y_qp[5] = math.inf
    y_pq[7] = 1e6  # so far off that Newton's steps stop shrinking or run out
    got = stack.epsilons(1e-5, y_pq, y_qp)
    assert not got.solved[[2, 5, 7]].any() and got.solved.sum() == 7
    # a truncated mass of at least delta: the one-pair path's bracketed solve answers it
    offset, log_pmf, _ = binomial_count_stack(steps, 0.05)
    heavy = np.full(steps.size, 2e-5)
    truncated = MixtureStack(offset, log_pmf, np.sqrt(steps.astype(float)), heavy)
    assert not truncated.epsilons(1e-5, y_pq, y_qp).solved.any()


def test_select_keeps_the_lanes():
    steps = np.arange(10, 30)
    stack, pairs = _stack(1.0, 0.1, steps)
    exact = [p.epsilon_warm(1e-5, None) for p in pairs]
    lanes = np.array([3, 11, 19])
    part = stack.select(lanes)
    got = part.epsilons(
        1e-5, np.array([exact[i][1][1] for i in lanes]), np.array([exact[i][1][2] for i in lanes])
    )
    assert part.size == 3 and got.solved.all()
    np.testing.assert_allclose(got.epsilon, [exact[i][0] for i in lanes], rtol=REL)
