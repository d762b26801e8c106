"""LastIterateHeuristicAccountant: the last-iterate heuristic behind dp_accounting's
``PrivacyAccountant`` interface.

References are independent of the package's heuristic code: dp_accounting's own PLD
accountant on the heuristic pair written as a ``MixtureOfGaussiansDpEvent``, and the
closed-form hockey-stick divergences of tests/analysis/_reference.py over enumerated inclusion
patterns (weights from a scalar SGD recursion written out here). The package's
``LastIterateHeuristic`` on the same run description is the third check: the accountant must
give its number exactly.
"""

from __future__ import annotations

import math
import subprocess
import sys

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from scipy import stats

from opacus_lastiterate.analysis import (
    DPSGDRun,
    LastIterateHeuristic,
    LastIterateHeuristicAccountant,
    sgd_weights,
)
from tests.analysis._reference import (
    ClosedFormMixture,
    enumerate_weighted_shifts,
    gaussian_mechanism_epsilon,
)

REL = 1e-6  # the heuristic against the closed-form references (both solve to ~1e-12)
DISCRETISATION = 1e-2  # dp_accounting's value_discretization_interval in the PLD comparison
Relation = dpa.NeighboringRelation


def poisson_step(q: float, sigma: float) -> dp_event.DpEvent:
    return dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma))


def mixture_event(steps: int, q: float, sigma: float) -> dp_event.MixtureOfGaussiansDpEvent:
    """The heuristic pair Binomial(T, q) + N(0, sigma^2 T) against N(0, sigma^2 T) as
    dp_accounting's mixture of Gaussians: sensitivities k = 0..T with probabilities
    Binomial(T, q)(k), one standard deviation sigma sqrt(T)."""
    k = np.arange(steps + 1)
    return dp_event.MixtureOfGaussiansDpEvent(
        sigma * math.sqrt(steps), k.astype(float).tolist(), stats.binom.pmf(k, steps, q).tolist()
    )


def heavy_ball_weights(lrs: np.ndarray, momentum: float) -> np.ndarray:
    """w_s = -(final parameter) of the scalar heavy-ball recursion b = beta b + g,
    m = m - eta_t b from m = 0, with gradient 1 at step s only (written out, no package code)."""
    out = []
    for s in range(lrs.size):
        m, b = 0.0, 0.0
        for t, lr in enumerate(lrs):
            g = 1.0 if t == s else 0.0
            b = g if t == 0 else momentum * b + g
            m -= lr * b
        out.append(-m)
    return np.array(out)


def weighted_reference(weights, rates, sigmas, delta: float) -> float:
    """Exact weighted pair sum_t w_t Bernoulli(q_t) + N(0, s^2) vs N(0, s^2) by enumeration."""
    w = np.asarray(weights, float) / np.max(weights)
    x, p = enumerate_weighted_shifts(w, rates)
    s = math.sqrt(float(np.sum((w * np.broadcast_to(sigmas, w.shape)) ** 2)))
    return ClosedFormMixture(x, p, s).epsilon(delta)


# -- (1) against dp_accounting's PLD accountant on the mixture event -----------------------


@pytest.mark.parametrize(
    "steps, q, sigma", [(100, 0.01, 1.0), (200, 0.05, 2.0), (30, 0.1, 1.5)]
)
def test_constant_rate_agrees_with_pld_accountant_on_the_mixture_event(steps, q, sigma):
    """dp_accounting rounds the privacy loss up to a grid of DISCRETISATION nats: its epsilon
    lies in [ours, ours + DISCRETISATION] and its delta in [ours(eps), ours(eps - grid)]."""
    ours = LastIterateHeuristicAccountant().compose(poisson_step(q, sigma), steps)
    pld = PLDAccountant(value_discretization_interval=DISCRETISATION)
    pld.compose(mixture_event(steps, q, sigma))
    for delta in (1e-5, 1e-3):
        eps, eps_pld = ours.get_epsilon(delta), pld.get_epsilon(delta)
        assert eps * (1 - 1e-9) <= eps_pld <= eps + DISCRETISATION
        assert eps == pytest.approx(
            ClosedFormMixture.binomial(steps, q, sigma).epsilon(delta), rel=REL
        )
    for eps in (0.1, 0.5, 1.0):
        d, d_pld = ours.get_delta(eps), pld.get_delta(eps)
        assert d * (1 - 1e-9) <= d_pld <= ours.get_delta(eps - DISCRETISATION)


def test_steps_composed_one_at_a_time_make_one_segment_and_the_same_number():
    one_by_one = LastIterateHeuristicAccountant()
    for _ in range(40):
        one_by_one.compose(poisson_step(0.05, 1.2))
    at_once = LastIterateHeuristicAccountant().compose(
        dpa.SelfComposedDpEvent(poisson_step(0.05, 1.2), 40)
    )
    assert one_by_one.run.as_history() == [(1.2, 0.05, 40)]
    assert one_by_one.get_epsilon(1e-6) == at_once.get_epsilon(1e-6)
    assert one_by_one.get_epsilon(1e-6) == pytest.approx(
        ClosedFormMixture.binomial(40, 0.05, 1.2).epsilon(1e-6), rel=REL
    )


# -- (2) changing rates, momentum and schedules ------------------------------------------------


def test_changing_rates_and_noise_give_the_poisson_binomial_pair():
    history = [(1.0, 0.2, 3), (1.5, 0.1, 4), (0.8, 0.3, 2), (1.0, 0.2, 2)]
    event = dpa.ComposedDpEvent(
        [dpa.SelfComposedDpEvent(poisson_step(q, s), t) for s, q, t in history]
    )
    acc = LastIterateHeuristicAccountant().compose(event)
    assert acc.run.as_history() == history  # one segment per maximal run of equal (sigma, q)
    sigmas = np.repeat([s for s, _, _ in history], [t for *_, t in history])
    rates = np.repeat([q for _, q, _ in history], [t for *_, t in history])
    for delta in (1e-5, 1e-3):
        eps = acc.get_epsilon(delta)
        assert eps == pytest.approx(weighted_reference(np.ones(11), rates, sigmas, delta), rel=REL)
        assert eps == LastIterateHeuristic(DPSGDRun.from_history(history)).epsilon(delta)


def test_momentum_and_a_schedule_through_the_weights_keyword():
    lrs = np.array([0.1, 0.1, 0.08, 0.06, 0.05, 0.04, 0.02, 0.01, 0.01, 0.005])
    weights = heavy_ball_weights(lrs, 0.9)
    np.testing.assert_allclose(sgd_weights(lrs, momentum=0.9), weights, rtol=1e-12)
    acc = LastIterateHeuristicAccountant(weights=weights)
    acc.compose(poisson_step(0.3, 1.0), 6).compose(poisson_step(0.2, 0.9), 4)
    rates, sigmas = [0.3] * 6 + [0.2] * 4, [1.0] * 6 + [0.9] * 4
    run = DPSGDRun.from_history([(1.0, 0.3, 6), (0.9, 0.2, 4)], weights=weights)
    for delta in (1e-5, 1e-3):
        eps, ref = acc.get_epsilon(delta), weighted_reference(weights, rates, sigmas, delta)
        assert eps == LastIterateHeuristic(run).epsilon(delta)
        assert ref * (1 - REL) <= eps <= ref * (1 + 1e-3)  # the weighted solver's accuracy
    # the weights matter: plain SGD at a constant rate gives another number
    plain = LastIterateHeuristicAccountant().compose(poisson_step(0.3, 1.0), 6)
    plain.compose(poisson_step(0.2, 0.9), 4)
    assert abs(plain.get_epsilon(1e-5) - acc.get_epsilon(1e-5)) > 1e-2


def test_callable_weights_give_the_final_model_after_every_step():
    lrs = np.linspace(0.1, 0.02, 8)
    acc = LastIterateHeuristicAccountant(weights=lambda t: heavy_ball_weights(lrs[:t], 0.5))
    for t in range(1, 9):
        acc.compose(poisson_step(0.25, 1.0))
        ref = weighted_reference(heavy_ball_weights(lrs[:t], 0.5), [0.25] * t, 1.0, 1e-5)
        assert ref * (1 - REL) <= acc.get_epsilon(1e-5) <= ref * (1 + 1e-3)


def test_robust_option_is_the_maximum_over_suffixes():
    acc = LastIterateHeuristicAccountant(robust=True).compose(poisson_step(0.01, 0.5), 30)
    per_suffix = [ClosedFormMixture.binomial(t, 0.01, 0.5).epsilon(1e-5) for t in range(1, 31)]
    assert max(per_suffix) > per_suffix[-1] * (1 + 1e-3)  # the maximum is not the last one
    assert max(per_suffix) * (1 - 1e-9) <= acc.get_epsilon(1e-5) <= max(per_suffix) * (1 + REL)
    assert "max over the last" in acc.label
    assert "final model only" in LastIterateHeuristicAccountant().label


def test_full_batch_gaussian_steps_are_the_gaussian_mechanism():
    acc = LastIterateHeuristicAccountant().compose(dpa.GaussianDpEvent(4.0), 9)
    mu = 9 / (4.0 * 3.0)  # T steps of weight 1, noise sd sigma sqrt(T)
    assert acc.get_epsilon(1e-5) == pytest.approx(gaussian_mechanism_epsilon(mu, 1e-5), rel=REL)


def test_fixed_size_batches_under_replace_special_are_the_pair_at_b_over_n():
    event = dpa.SampledWithoutReplacementDpEvent(200, 10, dpa.GaussianDpEvent(1.0))
    acc = LastIterateHeuristicAccountant(Relation.REPLACE_SPECIAL).compose(event, 50)
    assert acc.get_epsilon(1e-5) == pytest.approx(
        ClosedFormMixture.binomial(50, 10 / 200, 1.0).epsilon(1e-5), rel=REL
    )
    assert not LastIterateHeuristicAccountant().supports(event)  # add/remove: N changes


# -- (3) unsupported events: dp_accounting's own path -----------------------------------------

GAUSS = dpa.GaussianDpEvent(1.0)
UNSUPPORTED = [
    dpa.LaplaceDpEvent(1.0),
    dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0)),
    dpa.PoissonSampledDpEvent(0.0, GAUSS),
    dpa.PoissonSampledDpEvent(1.5, GAUSS),
    dpa.GaussianDpEvent(-1.0),
    dpa.RandomizedResponseDpEvent(0.5, 4),
    dpa.UnsupportedDpEvent(),
    dpa.ZCDpEvent(0.1),
    dpa.SampledWithReplacementDpEvent(100, 10, GAUSS),
    dpa.SingleEpochTreeAggregationDpEvent(1.0, 4),
    dpa.TruncatedSubsampledGaussianDpEvent(100, 0.1, 20, 1.0),
    dp_event.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.5, 0.5]),
    dpa.ComposedDpEvent([poisson_step(0.1, 1.0), dpa.LaplaceDpEvent(1.0)]),
    dpa.SelfComposedDpEvent(poisson_step(0.1, 1.0), -2),
]


@pytest.mark.parametrize("event", UNSUPPORTED, ids=lambda e: type(e).__name__)
def test_unsupported_events_go_through_dp_accountings_path(event):
    acc = LastIterateHeuristicAccountant().compose(poisson_step(0.1, 1.0), 5)
    before, ledger = acc.get_epsilon(1e-5), acc.ledger
    assert not acc.supports(event)
    with pytest.raises(dpa.UnsupportedEventError, match="Unsupported event"):
        acc.compose(event)
    assert acc.get_epsilon(1e-5) == before and acc.ledger == ledger  # nothing composed


def test_bad_arguments_raise_naming_the_parameter():
    with pytest.raises(ValueError, match="neighboring_relation"):
        LastIterateHeuristicAccountant(Relation.REPLACE_ONE)
    with pytest.raises(TypeError, match="neighboring_relation"):
        LastIterateHeuristicAccountant("add_or_remove")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"weights\[1\]"):
        LastIterateHeuristicAccountant(weights=[1.0, -1.0])
    with pytest.raises(ValueError, match="robust"):
        LastIterateHeuristicAccountant(weights=[1.0], robust=True)
    with pytest.raises(TypeError, match="robust"):
        LastIterateHeuristicAccountant(robust=1)  # type: ignore[arg-type]
    acc = LastIterateHeuristicAccountant(weights=[1.0, 1.0])
    with pytest.raises(ValueError, match="count"):
        acc.compose(poisson_step(0.1, 1.0), -1)
    with pytest.raises(TypeError, match="event"):
        acc.compose("step")  # type: ignore[arg-type]
    acc.compose(poisson_step(0.1, 1.0), 3)
    with pytest.raises(ValueError, match=r"`weights` must have one entry per composed step \(3\)"):
        acc.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="target_delta"):
        LastIterateHeuristicAccountant().get_epsilon(1.5)
    with pytest.raises(ValueError, match="target_epsilon"):
        LastIterateHeuristicAccountant().get_delta(-1.0)


# -- (4) epsilon and delta agree; the cases every accountant answers ---------------------------


@pytest.mark.parametrize(
    "weights, rel",
    # the weighted solver answers each query to within its accuracy (1e-3 relative)
    [(None, 1e-6), (np.linspace(1.0, 0.2, 12), 1e-3)],
)
def test_get_delta_inverts_get_epsilon(weights, rel):
    acc = LastIterateHeuristicAccountant(weights=weights).compose(poisson_step(0.2, 1.1), 12)
    for delta in (1e-6, 1e-4, 1e-2):
        eps = acc.get_epsilon(delta)
        assert acc.get_delta(eps) <= delta * (1 + rel)  # epsilon is never too small
        assert acc.get_delta(eps * (1 - 1e-2)) > delta  # nor much too large
    for eps in (0.3, 1.0):
        d = acc.get_delta(eps)
        assert acc.get_epsilon(d) == pytest.approx(eps, rel=max(rel, 1e-6) * 3)


def test_empty_noop_non_private_and_noiseless():
    for weights in (None, [1.0, 2.0]):
        empty = LastIterateHeuristicAccountant(weights=weights)
        assert empty.get_epsilon(1e-5) == 0.0 and empty.get_delta(0.0) == 0.0
    noop = LastIterateHeuristicAccountant().compose(dpa.NoOpDpEvent(), 3)
    assert noop.get_epsilon(1e-5) == 0.0 and noop.run.num_steps == 0
    steps = LastIterateHeuristicAccountant().compose(poisson_step(0.1, 1.0), 5)
    assert 0.0 < steps.get_epsilon(1e-5) < math.inf
    steps.compose(dpa.NonPrivateDpEvent())
    assert steps.get_epsilon(1e-5) == math.inf and steps.get_delta(10.0) == 1.0
    noiseless = LastIterateHeuristicAccountant().compose(poisson_step(0.1, 0.0))
    assert noiseless.get_epsilon(1e-5) == math.inf and noiseless.get_delta(10.0) == 1.0


def test_the_module_loads_neither_torch_nor_opacus():
    program = (
        "import sys\n"
        "import opacus_lastiterate.analysis.dp_accounting_accountant\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'torch', 'opacus'}\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True)
