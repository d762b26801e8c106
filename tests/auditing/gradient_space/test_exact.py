"""Exact epsilons (opacus_lastiterate.auditing.gradient_space.exact): A_S^{h*} by density evolution, the
malicious data set in closed form (checked against dp_accounting, brute force, simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr

from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.auditing import (
    DPSGDArithmetic,
    MaliciousDataset,
    PoissonInsertion,
    simulate_malicious_dataset,
)
from opacus_lastiterate.auditing.gradient_space.adversaries import WorstCaseLandscape
from opacus_lastiterate.auditing.gradient_space.exact import (
    discrete_epsilon,
    malicious_dataset_epsilon,
    malicious_dataset_test_rates,
    worst_case_landscape_epsilons,
)
from opacus_lastiterate.auditing.gradient_space.insertion import PeriodicInsertion
from opacus_lastiterate.auditing.gradient_space.simulator import simulate_worst_case_landscape


def test_first_step_is_the_gaussian_closed_form() -> None:
    for sigma in (1.0, 4.0):
        res = worst_case_landscape_epsilons(
            WorstCaseLandscape(2), noise_multiplier=sigma, steps=1, delta=1e-5, grid_step=0.02
        )
        assert res.epsilons[0] == pytest.approx(gaussian_epsilon(mu=1 / sigma, delta=1e-5), abs=1e-4)


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


# ---------------------------------------------------------------------------------------
# Malicious data set: closed-form epsilon of the final model.
# ---------------------------------------------------------------------------------------


def _pld_epsilon_one_step(q: float, sigma: float, delta: float) -> float:
    """dp_accounting's PLD epsilon of one Poisson-subsampled Gaussian step (independent;
    pessimistic, within about the discretisation interval 1e-4)."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    mech = pld.from_gaussian_mechanism(sigma, sampling_prob=q, value_discretization_interval=1e-4)
    return float(mech.get_epsilon_for_delta(delta))


@pytest.mark.parametrize("q,sigma", [(0.3, 0.8), (0.05, 0.5), (1.0, 1.0)])
def test_malicious_one_step_is_the_subsampled_gaussian(q: float, sigma: float) -> None:
    """T = 1: only the last coordinate, (1 - q) N(0) + q N(1) vs N(0): dp_accounting's value."""
    attack = MaliciousDataset(steps=1, insertion=PoissonInsertion(q))
    res = malicious_dataset_epsilon(attack, DPSGDArithmetic(sigma), delta=1e-5)
    assert res.epsilon == pytest.approx(_pld_epsilon_one_step(q, sigma, 1e-5), abs=1e-4)
    assert res.error < 1e-8


def test_malicious_hundred_steps_match_a_pld_composition() -> None:
    """T = 100 (the reproduction's setting): 99 record bits composed with the last coordinate
    (discretised on a fine grid), by dp_accounting's PLD of two probability mass functions."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    steps, q, sigma, tau, delta = 100, 0.01, 0.6, 3.0, 1e-5
    a0, a1 = ndtr(-tau / sigma), ndtr((1 - tau) / sigma)
    p1 = q * a1 + (1 - q) * a0
    bits = pld.from_two_probability_mass_functions(
        {0: math.log1p(-a0), 1: math.log(a0)}, {0: math.log1p(-p1), 1: math.log(p1)},
        symmetric=False, value_discretization_interval=1e-4,
    )
    edges = np.linspace(-12 * sigma, 1 + 12 * sigma, 40_001)
    qx = np.diff(ndtr(edges / sigma))
    px = (1 - q) * qx + q * np.diff(ndtr((edges - 1) / sigma))
    keep = np.nonzero((qx > 0) & (px > 0))[0]
    last = pld.from_two_probability_mass_functions(
        {int(i): math.log(qx[i]) for i in keep}, {int(i): math.log(px[i]) for i in keep},
        symmetric=False, value_discretization_interval=1e-4,
    )
    reference = bits.self_compose(steps - 1).compose(last).get_epsilon_for_delta(delta)
    attack = MaliciousDataset(steps=steps, insertion=PoissonInsertion(q), last_threshold=tau)
    res = malicious_dataset_epsilon(attack, DPSGDArithmetic(sigma), delta=delta)
    # reference: pessimistic rounding (up to ~1e-4 per composition) minus a grid's loss
    assert abs(res.epsilon - reference) < 3e-3, (res.epsilon, reference)


def test_malicious_small_model_brute_force() -> None:
    """T = 4, periodic and Poisson: every record pattern times a fine grid for x, then the
    discrete epsilon (no count reduction, no closed-form cut)."""
    sigma, tau, delta = 0.5, 1.2, 1e-3
    edges = np.linspace(-8.0, 9.0, 30_001)
    for insertion in (PoissonInsertion(0.4), PeriodicInsertion(2, 1)):
        attack = MaliciousDataset(steps=4, insertion=insertion, last_threshold=tau)
        p = insertion.presence_probabilities(4)
        laws = []
        for world in (1.0, 0.0):
            law = np.ones(1)
            for j in range(3):
                on = world * (p[j] * ndtr((1 - tau) / sigma) + (1 - p[j]) * ndtr(-tau / sigma)) + (
                    1 - world
                ) * ndtr(-tau / sigma)
                law = np.outer(law, [1 - on, on]).ravel()
            x = (1 - world * p[3]) * np.diff(ndtr(edges / sigma)) + world * p[3] * np.diff(
                ndtr((edges - 1) / sigma)
            )
            laws.append(np.outer(law, x).ravel())
        brute = discrete_epsilon(laws[0], laws[1], delta)
        res = malicious_dataset_epsilon(attack, DPSGDArithmetic(sigma), delta=delta)
        assert res.epsilon == pytest.approx(brute, abs=2e-3), insertion


def test_malicious_test_rates_match_simulation() -> None:
    """The exact rates of "score >= c" agree with the literal DP-SGD simulation (z <= 4.5)."""
    attack = MaliciousDataset(
        steps=6, insertion=PoissonInsertion(0.3), num_repeaters=2_000, big_value=20.0,
        last_threshold=1.0,
    )
    arith = DPSGDArithmetic(0.6, learning_rate=0.5, normalisation="expected", expected_batch_size=3.0)
    thresholds = np.array([-1.0, 0.0, 0.5, 1.5, 3.0])
    tpr, fpr = malicious_dataset_test_rates(attack, arith, thresholds)
    n = 20_000
    rng = np.random.default_rng(17)
    for inside, rate in ((True, tpr), (False, fpr)):
        scores = simulate_malicious_dataset(
            attack, arith, trials=n, rng=rng, canary_in=inside, method="literal"
        )
        freq = (scores[:, None] >= thresholds[None, :]).mean(0)
        se = np.sqrt(np.maximum(rate * (1 - rate), 1e-12) / n)
        assert np.all(np.abs(freq - rate) <= 4.5 * se + 1e-12), (inside, freq, rate)


def test_malicious_exact_is_below_standard_and_above_audits() -> None:
    """Sound: the final model leaks at most what all iterates do (standard accounting), and a
    valid audit of it stays below (here with a wide margin)."""
    from opacus_lastiterate.analysis.baselines.composition import standard_epsilon

    for sigma in (0.5, 0.8):
        attack = MaliciousDataset(steps=100, insertion=PoissonInsertion(0.01), last_threshold=3.0)
        res = malicious_dataset_epsilon(attack, DPSGDArithmetic(sigma), delta=1e-5)
        std = standard_epsilon(1e-5, steps=100, sample_rate=0.01, noise_multiplier=sigma)
        assert 0.0 < res.epsilon < std
    rng = np.random.default_rng(3)
    arith = DPSGDArithmetic(0.8)
    ins = simulate_malicious_dataset(attack, arith, trials=50_000, rng=rng, canary_in=True, method="counts")
    outs = simulate_malicious_dataset(attack, arith, trials=50_000, rng=rng, canary_in=False, method="counts")
    assert ScoreAudit(ins, outs).clopper_pearson(delta=1e-5).epsilon <= res.epsilon


def test_malicious_stated_error_grows_with_flips() -> None:
    arith = DPSGDArithmetic(1.0)
    safe = MaliciousDataset(steps=50, insertion=PoissonInsertion(0.05), last_threshold=3.0)
    leaky = MaliciousDataset(steps=50, insertion=PoissonInsertion(0.05), last_threshold=3.0, big_value=6.0)
    a = malicious_dataset_epsilon(safe, arith, delta=1e-5)
    b = malicious_dataset_epsilon(leaky, arith, delta=1e-5)
    assert a.omitted_mass < 1e-15 and a.error < 1e-8
    assert b.omitted_mass > 1e-8 and b.error > a.error
    worse = MaliciousDataset(steps=50, insertion=PoissonInsertion(0.05), last_threshold=3.0, big_value=3.0)
    assert math.isinf(malicious_dataset_epsilon(worse, arith, delta=1e-5).error)


def test_malicious_exact_argument_checks() -> None:
    attack = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.1))
    with pytest.raises(ValueError, match="constant divisor"):
        malicious_dataset_epsilon(attack, DPSGDArithmetic(1.0, normalisation="realised"), delta=1e-5)
    few = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.1), num_repeaters=3)
    with pytest.raises(ValueError, match="num_repeaters"):
        malicious_dataset_epsilon(few, DPSGDArithmetic(1.0), delta=1e-5)
    with pytest.raises(TypeError, match="attack"):
        malicious_dataset_epsilon(WorstCaseLandscape(2), DPSGDArithmetic(1.0), delta=1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delta"):
        malicious_dataset_epsilon(attack, DPSGDArithmetic(1.0), delta=0.0)
    with pytest.raises(ValueError, match="thresholds"):
        malicious_dataset_test_rates(attack, DPSGDArithmetic(1.0), np.array([np.nan]))
