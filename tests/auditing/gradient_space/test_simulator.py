"""The simulator: analytic path == literal path in law, exact laws, audits against the truth.

Tolerances come from the statistics of the check (KS at significance 1e-4, moments within
4.5 standard errors), never from recorded outputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.auditing import (
    AdversarialDataset,
    DPSGDArithmetic,
    MaliciousDataset,
    PoissonInsertion,
    audit_scores,
    simulate_adversarial_dataset,
    simulate_malicious_dataset,
)
from opacus_lastiterate.auditing.gradient_space.adversaries import WorstCaseLandscape
from opacus_lastiterate.auditing.gradient_space.insertion import PeriodicInsertion
from opacus_lastiterate.auditing.gradient_space.simulator import simulate_worst_case_landscape

KS_LEVEL = 1e-4  # each KS test rejects a true null with probability 1e-4
Z_TOL = 4.5  # moment checks: |error| <= 4.5 standard errors (two-sided level ~ 7e-6)

ADVERSARIAL_CASES = [
    ("sum", PoissonInsertion(0.1), 0, None, "noise"),
    ("expected", PoissonInsertion(0.2), 0, 4.0, "noise"),
    ("expected", PeriodicInsertion(3, 1), 0, 2.5, "noise"),
    ("realised", PoissonInsertion(0.3), 5, None, "noise"),
    ("realised", PoissonInsertion(0.3), 5, None, "skip"),
    ("realised", PeriodicInsertion(2), 4, None, "noise"),
]


def _adversarial(norm, insertion, others, batch, empty):
    rate = 0.25 if isinstance(insertion, PeriodicInsertion) and others else None
    attack = AdversarialDataset(insertion, num_others=others, others_sample_rate=rate)
    arith = DPSGDArithmetic(
        0.7, clipping_norm=1.5, learning_rate=0.3, normalisation=norm,
        expected_batch_size=batch, empty_batch=empty,
    )
    return attack, arith


@pytest.mark.parametrize("case", range(len(ADVERSARIAL_CASES)))
@pytest.mark.parametrize("canary_in", [True, False])
def test_adversarial_analytic_equals_literal(case: int, canary_in: bool) -> None:
    attack, arith = _adversarial(*ADVERSARIAL_CASES[case])
    rng = np.random.default_rng(100 * case + canary_in)
    kw = {"steps": 30, "trials": 20_000, "rng": rng, "canary_in": canary_in}
    fast = simulate_adversarial_dataset(attack, arith, method="analytic", **kw)
    slow = simulate_adversarial_dataset(attack, arith, method="literal", **kw)
    assert stats.ks_2samp(fast, slow).pvalue > KS_LEVEL


def _mixture_cdf(steps: int, q: float, sigma: float):
    k = np.arange(steps + 1)
    w = stats.binom.pmf(k, steps, q)
    s = sigma * math.sqrt(steps)
    return lambda x: (w * stats.norm.cdf((np.asarray(x)[..., None] - k) / s)).sum(-1)


@pytest.mark.parametrize("method", ["analytic", "literal"])
def test_adversarial_scores_have_the_last_iterate_law(method: str) -> None:
    """SGM, Poisson canary, lr = C = 1: score ~ P = Binomial(T, q) + N(0, sigma^2 T), Q = N(0, sigma^2 T)."""
    steps, q, sigma, n = 40, 0.2, 0.8, 20_000
    attack = AdversarialDataset(PoissonInsertion(q))
    arith = DPSGDArithmetic(sigma)
    rng = np.random.default_rng(11)
    p = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=True, method=method)
    qq = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=False, method=method)
    assert stats.kstest(p, _mixture_cdf(steps, q, sigma)).pvalue > KS_LEVEL
    assert stats.kstest(qq, stats.norm(0, sigma * math.sqrt(steps)).cdf).pvalue > KS_LEVEL
    var_p = steps * q * (1 - q) + sigma**2 * steps
    assert abs(p.mean() - steps * q) < Z_TOL * math.sqrt(var_p / n)
    # variance of the sample variance ~ 2 var^2 / n (+ excess kurtosis of the binomial part, small)
    assert abs(p.var() - var_p) < Z_TOL * var_p * math.sqrt(2.5 / n)


@pytest.mark.parametrize("norm,batch", [("sum", None), ("expected", 3.0)])
@pytest.mark.parametrize("canary_in", [True, False])
def test_malicious_analytic_equals_literal(norm, batch, canary_in) -> None:
    arith = DPSGDArithmetic(0.6, learning_rate=0.5, normalisation=norm, expected_batch_size=batch)
    attack = MaliciousDataset(steps=6, insertion=PoissonInsertion(0.3), num_repeaters=2_000, big_value=20.0)
    rng = np.random.default_rng(5 + canary_in)
    kw = {"trials": 20_000, "rng": rng, "canary_in": canary_in}
    fast = simulate_malicious_dataset(attack, arith, method="analytic", return_models=True, **kw)
    slow = simulate_malicious_dataset(attack, arith, method="literal", return_models=True, **kw)
    u = attack.unit(arith)
    # the stored records: signs agree in law (two-proportion z-test per coordinate) and the
    # within-record noise is N(0, (sigma U)^2) in both paths
    for j in range(attack.steps - 1):
        a, b = (fast[:, j] > 0).mean(), (slow[:, j] > 0).mean()
        pooled = (a + b) / 2
        se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / 20_000)
        assert abs(a - b) <= Z_TOL * se + 1e-12
        for models in (fast, slow):
            noise = models[:, j] - np.where(models[:, j] > 0, 20.0 * u, -20.0 * u)
            assert stats.kstest(noise, stats.norm(0.0, 0.6 * u).cdf).pvalue > KS_LEVEL
    assert stats.ks_2samp(fast[:, -1], slow[:, -1]).pvalue > KS_LEVEL
    assert stats.ks_2samp(attack.score(fast, arith), attack.score(slow, arith)).pvalue > KS_LEVEL


@pytest.mark.parametrize("insertion", [PoissonInsertion(0.3), PeriodicInsertion(2, 1)])
@pytest.mark.parametrize("canary_in", [True, False])
def test_malicious_counts_equals_literal_with_flips(insertion, canary_in) -> None:
    """Small BIG and t_past: re-threshold flips and decoding errors are frequent (several %),
    and the counts path (Poisson-binomial of the decoded records) still has the literal law."""
    arith = DPSGDArithmetic(0.6)
    attack = MaliciousDataset(
        steps=8, insertion=insertion, num_repeaters=2_000, big_value=1.2,
        last_threshold=1.0, past_threshold=0.3,
    )
    assert attack.flip_probabilities(0.6)[0] > 0.05
    rng = np.random.default_rng(40 + canary_in)
    fast = simulate_malicious_dataset(attack, arith, trials=40_000, rng=rng, canary_in=canary_in, method="counts")
    slow = simulate_malicious_dataset(attack, arith, trials=20_000, rng=rng, canary_in=canary_in, method="literal")
    assert stats.ks_2samp(fast, slow).pvalue > KS_LEVEL
    # the decoded records' frequencies are the stated probabilities
    models = simulate_malicious_dataset(
        attack, arith, trials=20_000, rng=rng, canary_in=canary_in, method="literal", return_models=True
    )
    p = insertion.presence_probabilities(8)[:-1]
    want = attack.decoded_probabilities(0.6, present=False)
    if canary_in:
        want = p * attack.decoded_probabilities(0.6, present=True) + (1 - p) * want
    got = (models[:, :-1] >= 0).mean(0)
    assert np.all(np.abs(got - want) <= Z_TOL * np.sqrt(want * (1 - want) / 20_000))


def test_malicious_counts_refuses_models_and_checks_method() -> None:
    attack = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.3))
    kw = {"trials": 5, "rng": np.random.default_rng(0), "canary_in": True}
    with pytest.raises(ValueError, match="scores only"):
        simulate_malicious_dataset(attack, DPSGDArithmetic(0.6), method="counts", return_models=True, **kw)
    with pytest.raises(ValueError, match="counts"):
        simulate_malicious_dataset(attack, DPSGDArithmetic(0.6), method="fast", **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="constant divisor"):
        simulate_malicious_dataset(attack, DPSGDArithmetic(0.6, normalisation="realised"), method="counts", **kw)


def test_malicious_literal_realised_runs_and_analytic_refuses() -> None:
    arith = DPSGDArithmetic(0.6, normalisation="realised")
    attack = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.3), num_repeaters=500, big_value=10.0)
    s = simulate_malicious_dataset(attack, arith, trials=50, rng=np.random.default_rng(0), canary_in=True, method="literal")
    assert s.shape == (50,) and np.all(np.isfinite(s))
    with pytest.raises(ValueError, match="constant divisor"):
        simulate_malicious_dataset(attack, arith, trials=5, rng=np.random.default_rng(0), canary_in=True)
    few = MaliciousDataset(steps=4, insertion=PoissonInsertion(0.3), num_repeaters=5, big_value=10.0)
    with pytest.raises(ValueError, match="num_repeaters"):
        simulate_malicious_dataset(few, DPSGDArithmetic(0.6), trials=5, rng=np.random.default_rng(0), canary_in=True)


def test_worst_case_first_step_and_tightness_at_large_batch() -> None:
    sigma, n = 2.0, 20_000
    attack = WorstCaseLandscape(batch_size=64)
    rng = np.random.default_rng(3)
    ins = simulate_worst_case_landscape(attack, noise_multiplier=sigma, steps=10, trials=n, rng=rng, canary_in=True)
    outs = simulate_worst_case_landscape(attack, noise_multiplier=sigma, steps=10, trials=n, rng=rng, canary_in=False)
    assert ins.shape == (n, 10)
    assert stats.kstest(ins[:, 0], stats.norm(1.0, sigma).cdf).pvalue > KS_LEVEL
    assert stats.kstest(outs[:, 0], stats.norm(0.0, sigma).cdf).pvalue > KS_LEVEL
    # drift C per step against noise sigma C / B = C / 32: the side of h* taken at step 1 is
    # kept (a crossing needs a 16-sigma step), so theta_T - theta_1 ~ +-9 C exactly.
    side = ins[:, 0] > 0.5
    assert np.all((ins[:, -1] > 0.5) == side)


def test_audits_of_exact_pair_stay_below_heuristic() -> None:
    """Scores with exactly the heuristic's law: the 95% bound exceeds eps_heur at most at ~5%."""
    steps, q, sigma, delta, n, reps = 100, 0.1, 1.0, 1e-5, 3_000, 20
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    attack, arith = AdversarialDataset(PoissonInsertion(q)), DPSGDArithmetic(sigma)
    rng = np.random.default_rng(21)
    exceed = 0
    for _ in range(reps):
        ins = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=True)
        outs = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=False)
        exceed += audit_scores(ins, outs, delta=delta).bound.epsilon > eps_h
    assert exceed <= stats.binom.ppf(1 - 1e-3, reps, 0.05)


def test_audit_bound_grows_towards_heuristic() -> None:
    steps, q, sigma, delta = 100, 0.1, 1.0, 1e-5
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    attack, arith = AdversarialDataset(PoissonInsertion(q)), DPSGDArithmetic(sigma)
    rng = np.random.default_rng(8)
    bounds = []
    for n in (1_000, 10_000, 100_000):
        ins = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=True)
        outs = simulate_adversarial_dataset(attack, arith, steps=steps, trials=n, rng=rng, canary_in=False)
        bounds.append(audit_scores(ins, outs, delta=delta).bound.epsilon)
    assert bounds[0] < bounds[1] < bounds[2] < eps_h, (bounds, eps_h)


def test_malicious_attack_beats_heuristic() -> None:
    """Appendix C: a valid 95% lower bound above the heuristic (small configuration)."""
    steps, q, sigma, delta, n = 100, 0.01, 0.4, 1e-5, 20_000
    eps_h = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
    attack = MaliciousDataset(steps=steps, insertion=PoissonInsertion(q), last_threshold=2.0)
    arith = DPSGDArithmetic(sigma)
    rng = np.random.default_rng(2024)
    ins = simulate_malicious_dataset(attack, arith, trials=n, rng=rng, canary_in=True)
    outs = simulate_malicious_dataset(attack, arith, trials=n, rng=rng, canary_in=False)
    result = audit_scores(ins, outs, delta=delta).bound
    assert result.is_bound and result.epsilon > eps_h, (result.epsilon, eps_h)


def test_simulator_argument_checks() -> None:
    attack, arith = AdversarialDataset(PoissonInsertion(0.1)), DPSGDArithmetic(1.0)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="method"):
        simulate_adversarial_dataset(attack, arith, steps=2, trials=2, rng=rng, canary_in=True, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        simulate_adversarial_dataset(attack, arith, steps=0, trials=2, rng=rng, canary_in=True)
    with pytest.raises(TypeError, match="rng"):
        simulate_adversarial_dataset(attack, arith, steps=2, trials=2, rng=0, canary_in=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="canary_in"):
        simulate_adversarial_dataset(attack, arith, steps=2, trials=2, rng=rng, canary_in=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attack"):
        simulate_adversarial_dataset(arith, arith, steps=2, trials=2, rng=rng, canary_in=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="noise_multiplier"):
        simulate_worst_case_landscape(WorstCaseLandscape(2), noise_multiplier=-1.0, steps=2, trials=2, rng=rng, canary_in=True)


def test_seeded_reproducibility() -> None:
    attack, arith = AdversarialDataset(PoissonInsertion(0.1)), DPSGDArithmetic(1.0)
    a = simulate_adversarial_dataset(attack, arith, steps=5, trials=10, rng=np.random.default_rng(1), canary_in=True)
    b = simulate_adversarial_dataset(attack, arith, steps=5, trials=10, rng=np.random.default_rng(1), canary_in=True)
    np.testing.assert_array_equal(a, b)


def test_audit_scores_is_both_score_audit_analyses() -> None:
    from opacus_lastiterate.analysis.audit import NaiveMax, ScoreAudit

    rng = np.random.default_rng(4)
    ins, outs = rng.normal(1.0, 1.0, 200), rng.normal(0.0, 1.0, 200)
    kw = {"delta": 1e-5, "confidence": 0.9, "threshold_strategy": NaiveMax()}
    result = audit_scores(ins, outs, **kw)  # type: ignore[arg-type]
    audit = ScoreAudit(ins, outs)
    assert result.bound == audit.clopper_pearson(**kw)  # type: ignore[arg-type]
    assert result.estimate == audit.gaussian_dp(**kw)  # type: ignore[arg-type]
