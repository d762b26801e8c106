"""The array composition of the standard (PLD) value against dp_accounting's own PLD
composition, built independently in each test from ``from_gaussian_mechanism``.

Tolerances: the array route skips dp_accounting's truncation after each one-step segment
(which adds 1e-15 to the mass at infinity each), so its delta may be lower by about 1e-15
per such segment (2e-15 allowed) and is otherwise equal to floating-point rounding
(relative 1e-9); epsilon is never above dp_accounting's (relative 1e-9) and at most 1e-6
relative below it (the skipped mass against delta = 1e-8)."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.baselines.pld_composition import (
    PLDComposer,
    compose_subsampled_gaussian,
)
from opacus_lastiterate.analysis.baselines.subsampled_gaussian_pld import (
    subsampled_gaussian_pmfs,
)
from opacus_lastiterate.analysis.run import DPSGDRun

EPSILONS = [0.0, 0.1, 0.5, 1.0, 2.0, 4.0]


def _reference(history, interval, pessimistic=True):
    """dp_accounting: one PLD per segment from from_gaussian_mechanism, self-composed and
    composed in order."""
    out = None
    for sigma, q, steps in history:
        one = pld.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=interval,
            pessimistic_estimate=pessimistic, use_connect_dots=pessimistic,
        ).self_compose(steps)
        out = one if out is None else out.compose(one)
    return out


@pytest.mark.parametrize("sigma,q", [(0.8, 0.01), (2.0, 0.2), (0.6, 1.0), (5.0, 0.001)])
def test_one_step_pmfs_are_dp_accountings(sigma, q):
    remove, add = subsampled_gaussian_pmfs(sigma, q, 1e-3)
    ours = PrivacyLossDistribution(
        pld_pmf.DensePLDPmf(1e-3, remove.lower, remove.probs, remove.infinity_mass, True),
        pld_pmf.DensePLDPmf(1e-3, add.lower, add.probs, add.infinity_mass, True),
    )
    ref = _reference([(sigma, q, 1)], 1e-3)
    # delta is a sum of masses that are differences of normal cdfs of order 1: its rounding
    # is absolute, a few ulp of 1 per mass, and differs with numpy's SIMD kernels (1.03e-15
    # measured at delta ~1e-13 with numpy limited to its baseline kernels): atol 1e-14
    np.testing.assert_allclose(
        ours.get_delta_for_epsilon(EPSILONS), ref.get_delta_for_epsilon(EPSILONS),
        rtol=1e-9, atol=1e-14,
    )


HISTORIES = [
    [(0.999**t, 0.01, 1) for t in range(12)],
    [(1.0, 0.01, 5), (0.7, 0.02, 1), (2.0, 0.1, 3), (0.9, 1.0, 1), (1.3, 0.005, 7)],
    [(0.6, 1.0, 2), (0.8, 1.0, 1)],
]


@pytest.mark.parametrize("history", HISTORIES)
def test_composition_matches_dp_accounting(history):
    ours = compose_subsampled_gaussian(history, 1e-3)
    ref = _reference(history, 1e-3)
    slack = 2e-15 * sum(1 for *_, n in history if n == 1)
    ours_d = np.asarray(ours.get_delta_for_epsilon(EPSILONS))
    ref_d = np.asarray(ref.get_delta_for_epsilon(EPSILONS))
    assert np.all(ours_d <= ref_d * (1 + 1e-9) + 1e-18)
    assert np.all(ours_d >= ref_d * (1 - 1e-9) - slack)
    for delta in (1e-5, 1e-8):
        eps, ref_eps = ours.get_epsilon_for_delta(delta), ref.get_epsilon_for_delta(delta)
        assert ref_eps * (1 - 1e-6) <= eps <= ref_eps * (1 + 1e-9)


def test_standard_composition_is_an_upper_bound_of_a_finer_optimistic_estimate():
    """Changing noise: the value (interval 1e-3) is above dp_accounting's optimistic
    estimate at interval 1e-4 (a lower bound on the exact value) and within 1% of it."""
    history = [(0.99**t, 0.02, 1) for t in range(15)]
    ours = StandardComposition(DPSGDRun.from_history(history), value_discretization_interval=1e-3)
    lower = _reference(history, 1e-4, pessimistic=False)
    for delta in (1e-5, 1e-8):
        exact_below = lower.get_epsilon_for_delta(delta)
        assert exact_below <= ours.epsilon(delta) <= exact_below * 1.01


def test_composer_added_to_segment_by_segment_equals_the_whole_run():
    history = HISTORIES[1]
    composer = PLDComposer(1e-3)
    for k, (sigma, q, steps) in enumerate(history):
        composer.add(sigma, q, steps)
        whole = compose_subsampled_gaussian(history[: k + 1], 1e-3)
        np.testing.assert_array_equal(
            composer.pld().get_delta_for_epsilon(EPSILONS), whole.get_delta_for_epsilon(EPSILONS)
        )
    assert PLDComposer(1e-3).pld().get_epsilon_for_delta(1e-5) == 0.0
