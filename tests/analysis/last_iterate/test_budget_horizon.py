"""The shifted-count bound: m certified steps really stay within the limit, checked against
the from-scratch heuristic of the extended runs (several futures of noise multipliers and
sample rates), and m is the largest m whose bound is within the limit."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.budget_horizon import (
    _count_and_variance,
    shifted_count_epsilon,
    steps_within_limit,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.run import DPSGDRun

DELTA = 1e-5


def _epsilon(history: list[tuple[float, float, int]]) -> float:
    return LastIterateHeuristic(DPSGDRun.from_history(history)).epsilon(DELTA)


@pytest.mark.parametrize(
    "history", [[(1.0, 0.05, 40)], [(1.5, 0.02, 30), (0.8, 0.1, 10)]]
)
def test_certified_steps_stay_within_the_limit(history: list[tuple[float, float, int]]) -> None:
    now = _epsilon(history)
    limit = 2.0 * now
    m = steps_within_limit(history, DELTA, limit, 500)
    assert 1 <= m < 500
    rng = np.random.default_rng(1)
    futures = [[(history[-1][0], history[-1][1])] * m]  # the same settings
    futures.append([(float(s), float(q)) for s, q in zip(
        rng.uniform(0.5, 2.0, m), rng.uniform(0.01, 0.5, m), strict=True)])
    for future in futures:
        run = list(history)
        for j, (sigma, q) in enumerate(future, start=1):
            run.append((sigma, q, 1))
            if j in (1, m // 2 or 1, m):
                assert _epsilon(run) <= limit
    count, variance = _count_and_variance(history)
    assert shifted_count_epsilon(count, variance, m + 1, DELTA) > limit * (1 - 1e-9)
    assert shifted_count_epsilon(count, variance, m, DELTA) <= limit


def test_no_step_is_certified_without_noise_or_room() -> None:
    assert steps_within_limit([(0.0, 0.1, 5)], DELTA, 10.0, 100) == 0
    assert steps_within_limit([], DELTA, 10.0, 100) == 0
    history = [(1.0, 0.05, 40)]
    assert steps_within_limit(history, DELTA, 0.5 * _epsilon(history), 100) == 0
    assert steps_within_limit(history, DELTA, 1e6, 100) == 100
