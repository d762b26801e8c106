"""The vectorised one-step PLD against dp_accounting's own scalar route (``from_gaussian_mechanism``
with connect-the-dots), and standard composition against dp_accounting's ``PLDAccountant``."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.baselines.subsampled_gaussian_pld import subsampled_gaussian_pld

# Both routes do the same floating-point operations except that numpy's vectorised log/exp may
# round differently in the last bit. The PMF is a second difference of delta on the grid, which
# turns such ulps into absolute differences of up to 2.2e-12 in single probabilities; epsilon
# after 100 compositions then moves by up to 1.6e-10 relative (measured over the grid below).
PMF_ABS = 1e-11
EPS_REL = 1e-9


def _dense(pmf):
    return None if pmf is None else pmf.to_dense_pmf()


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("q", [1e-3, 0.01, 0.1, 0.5, 1.0])
@pytest.mark.parametrize("interval", [1e-4, 1e-3])
def test_one_step_pld_is_dp_accountings(sigma, q, interval):
    ref = pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=interval)
    ours = subsampled_gaussian_pld(sigma, q, interval)
    for a, b in [(ref._pmf_remove, ours._pmf_remove), (ref._pmf_add, ours._pmf_add)]:
        a, b = _dense(a), _dense(b)
        assert (a is None) == (b is None)
        if a is None:
            continue
        assert a._lower_loss == b._lower_loss
        assert a._probs.shape == b._probs.shape
        np.testing.assert_allclose(b._probs, a._probs, rtol=0, atol=PMF_ABS)
        assert b._infinity_mass == pytest.approx(a._infinity_mass, rel=0, abs=1e-15)
    assert ours._symmetric == ref._symmetric
    eps_ref = ref.self_compose(100).get_epsilon_for_delta(1e-5)
    assert ours.self_compose(100).get_epsilon_for_delta(1e-5) == pytest.approx(eps_ref, rel=EPS_REL)


def test_edge_of_the_add_and_remove_ranges_matches():
    # q = 0.5: log(1 - q) = -log 2 is a multiple of no grid step, but a grid this coarse puts
    # points within math.isclose of the edge for the remove and add cases alike.
    interval = float(np.log(2.0)) / 7
    ref = pld.from_gaussian_mechanism(1.0, sampling_prob=0.5, value_discretization_interval=interval)
    ours = subsampled_gaussian_pld(1.0, 0.5, interval)
    for eps in (0.0, 0.5, 1.0, 3.0):
        assert ours.get_delta_for_epsilon(eps) == pytest.approx(
            ref.get_delta_for_epsilon(eps), rel=1e-9, abs=1e-15
        )


@pytest.mark.parametrize(
    "history",
    [
        [(1.0, 0.01, 1000)],
        [(0.8, 0.02, 300), (1.5, 0.05, 200), (0.8, 0.02, 100)],
        [(2.0, 1.0, 50), (1.1, 256 / 60000, 700)],
    ],
)
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_standard_composition_is_pld_accountants(history, delta):
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=1e-4
    )
    for sigma, q, steps in history:
        acc.compose(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
        )
    model = StandardComposition(history)
    assert model.epsilon(delta) == pytest.approx(acc.get_epsilon(delta), rel=EPS_REL)
    eps = acc.get_epsilon(delta)
    assert model.delta(eps) == pytest.approx(acc.get_delta(eps), rel=1e-8)
