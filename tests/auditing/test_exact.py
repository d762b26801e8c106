"""Exact epsilon of A_S^{h*} by density evolution (opacus_lastiterate.auditing.exact)."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.audit import ScoreAudit, gaussian_dp_epsilon
from opacus_lastiterate.auditing import WorstCaseLandscape, simulate_worst_case_landscape
from opacus_lastiterate.auditing.exact import discrete_epsilon, worst_case_landscape_epsilons


def test_first_step_is_the_gaussian_closed_form() -> None:
    for sigma in (1.0, 4.0):
        res = worst_case_landscape_epsilons(
            WorstCaseLandscape(2), noise_multiplier=sigma, steps=1, delta=1e-5, grid_step=0.02
        )
        assert res.epsilons[0] == pytest.approx(gaussian_dp_epsilon(1 / sigma, 1e-5), abs=1e-4)


def test_amplification_shape_and_stated_error() -> None:
    """eps_25 / eps_1 grows with B (about 0.25 at B = 1, 0.95 at B = 16) and the stated
    discretisation error is small against it."""
    ratios = []
    for b in (1, 4, 16):
        res = worst_case_landscape_epsilons(
            WorstCaseLandscape(b), noise_multiplier=2.0, steps=25, delta=1e-5, grid_step=0.02
        )
        assert res.error[-1] < 1e-3 and res.lost_mass < 1e-9
        ratios.append(res.epsilons[-1] / res.epsilons[0])
    assert 0.2 < ratios[0] < 0.3 and 0.55 < ratios[1] < 0.65 and 0.9 < ratios[2] < 1.0


def test_simulated_audit_stays_below_exact() -> None:
    attack = WorstCaseLandscape(4)
    exact = worst_case_landscape_epsilons(
        attack, noise_multiplier=1.0, steps=10, delta=1e-5, grid_step=0.02
    )
    rng = np.random.default_rng(7)
    kw = {"noise_multiplier": 1.0, "steps": 10, "trials": 20_000, "rng": rng}
    ins = simulate_worst_case_landscape(attack, canary_in=True, **kw)[:, -1]
    outs = simulate_worst_case_landscape(attack, canary_in=False, **kw)[:, -1]
    bound = ScoreAudit(ins, outs).clopper_pearson(delta=1e-5).epsilon
    assert 0 < bound <= exact.epsilons[-1]


def test_discrete_epsilon_basics() -> None:
    p = np.array([0.5, 0.5])
    assert discrete_epsilon(p, p, 1e-5) == 0.0
    q = np.array([0.25, 0.75])
    # delta(eps) = max(0.5 - 0.25 e^eps, 0.75 - 0.5 e^eps) -> 0 at eps = ln 2.
    assert discrete_epsilon(q, p, 1e-12) == pytest.approx(np.log(2), abs=1e-8)
    with pytest.raises(ValueError, match="`grid_step` must divide"):
        worst_case_landscape_epsilons(
            WorstCaseLandscape(1), noise_multiplier=1.0, steps=2, delta=1e-5, grid_step=0.3
        )
