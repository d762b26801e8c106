"""Fast Monte Carlo simulation of attacks whose model reduces to a few coordinates.

numpy only, vectorised over trials (never a Python loop over trials), seeded by a
``numpy.random.Generator``. Every simulator returns one score per trial for the world
with the canary (``canary_in=True``, data set D') or without it (D); feed the two score
arrays to :func:`audit_scores` (or any audit of :mod:`opacus_lastiterate.analysis.audit`).

The DP-SGD arithmetic is :class:`~opacus_lastiterate.auditing.gradient_space.arithmetic.DPSGDArithmetic`
(clip, sum, add N(0, sigma^2 C^2), divide by 1 / the expected / the realised batch size,
times the learning rate). Two paths where the mechanism allows it:

- ``method="literal"``: step by step, drawing each step's presence, batch size and noise;
- ``method="analytic"``: the same law with the per-step draws summed in closed form
  (Binomial counts and one Gaussian for constant divisors; a multinomial histogram of the
  (presence, batch size) pairs for the realised divisor; for the malicious data set, the
  per-coordinate records and the two-state flip chain of the re-thresholding);
- ``method="counts"`` (malicious data set, scores only): the score's sufficient statistic
  (counts of decoded records, last coordinate) drawn from its exact law.

The paths are tested against each other in distribution (``tests/auditing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_int,
    check_noise_multiplier,
)
from opacus_lastiterate.analysis.audit import (
    AuditResult,
    ScoreAudit,
    ThresholdStrategy,
)
from opacus_lastiterate.analysis.audit.threshold_strategies import DEFAULT_THRESHOLD_STRATEGY
from opacus_lastiterate.auditing.gradient_space.adversaries import (
    AdversarialDataset,
    MaliciousDataset,
    WorstCaseLandscape,
)
from opacus_lastiterate.auditing.gradient_space.arithmetic import DPSGDArithmetic
from opacus_lastiterate.auditing.gradient_space.insertion import (
    PeriodicInsertion,
    PoissonInsertion,
    check_rng,
)

__all__ = [
    "SimulatedAudit",
    "audit_scores",
    "simulate_adversarial_dataset",
    "simulate_malicious_dataset",
]

Method = Literal["analytic", "literal"]
MaliciousMethod = Literal["analytic", "literal", "counts"]
_CHUNK_FLOATS = 1 << 22  # floats per vectorised block (32 MiB)
_PMF_FLOOR = 1e-300  # batch sizes rarer than this are never drawn by the multinomial path


def _check_type(name: str, value: object, cls: type) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"`{name}` must be a {cls.__name__}, got {type(value).__name__}.")


def _check_method(method: object) -> Method:
    if method not in ("analytic", "literal"):
        raise ValueError(f"`method` must be 'analytic' or 'literal', got {method!r}.")
    return method  # type: ignore[return-value]


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool, got {value!r}.")
    return bool(value)


def _chunks(trials: int, per_trial: int) -> list[tuple[int, int]]:
    size = max(1, _CHUNK_FLOATS // max(per_trial, 1))
    return [(s, min(s + size, trials)) for s in range(0, trials, size)]


# ---------------------------------------------------------------------------------------
# Adversarial data set: Dirac canary, other gradients zero.
# ---------------------------------------------------------------------------------------


def simulate_adversarial_dataset(
    attack: AdversarialDataset,
    arithmetic: DPSGDArithmetic,
    *,
    steps: int,
    trials: int,
    rng: np.random.Generator,
    canary_in: bool,
    method: Method = "analytic",
) -> NDArray[np.float64]:
    """Scores ``theta_0[c] - theta_T[c]`` of the adversarial-data-set attack.

    Per step (one coordinate; the others never move): ``lr (b_t C + sigma C Z_t) / divisor_t``.
    Analytic path, constant divisor D: ``(lr / D) (C K + sigma C sqrt(T) Z)`` with K the
    insertion count (Binomial(T, q) for Poisson insertion). Realised divisor: the counts
    of steps per (b, ``|B|``) pair are multinomial; the score is
    ``lr (C sum_m N_{1,m} / m + sigma C sqrt(sum N_{b,m} / d_{b,m}^2) Z)``.
    """
    _check_type("attack", attack, AdversarialDataset)
    _check_type("arithmetic", arithmetic, DPSGDArithmetic)
    t = check_int("steps", steps, minimum=1)
    n = check_int("trials", trials, minimum=1)
    check_rng(rng)
    inside = _check_bool("canary_in", canary_in)
    how = _check_method(method)
    if how == "literal":
        return _adversarial_literal(attack, arithmetic, t, n, rng, inside)
    if arithmetic.normalisation != "realised":
        scale = arithmetic.learning_rate / float(arithmetic.divisor())
        c, s = arithmetic.clipping_norm, arithmetic.noise_std
        k = attack.insertion.count(rng, n, t) if inside else np.zeros(n, dtype=np.int64)
        return scale * (c * k + s * math.sqrt(t) * rng.standard_normal(n))
    return _adversarial_realised_analytic(attack, arithmetic, t, n, rng, inside)


def _adversarial_literal(
    attack: AdversarialDataset,
    arithmetic: DPSGDArithmetic,
    steps: int,
    trials: int,
    rng: np.random.Generator,
    inside: bool,
) -> NDArray[np.float64]:
    canary = arithmetic.clip(attack.craft(arithmetic).gradient)[0]  # clip the norm-C vector
    theta = np.zeros(trials)  # theta_0 = 0 in the canary coordinate
    realised = arithmetic.normalisation == "realised"
    rate = attack.others_rate if realised else 0.0
    for step in range(steps):
        present = (
            attack.insertion.draw_step(rng, step, trials) if inside else np.zeros(trials, bool)
        )
        summed = np.where(present, canary, 0.0)  # the others' clipped gradients are zero
        noisy = summed + arithmetic.noise_std * rng.standard_normal(trials)
        if realised:
            batch = present.astype(np.int64) + rng.binomial(attack.num_others, rate, trials)
            theta -= arithmetic.step_scale(batch) * noisy
        else:
            theta -= arithmetic.step_scale() * noisy
    return -theta


def _adversarial_realised_analytic(
    attack: AdversarialDataset,
    arithmetic: DPSGDArithmetic,
    steps: int,
    trials: int,
    rng: np.random.Generator,
    inside: bool,
) -> NDArray[np.float64]:
    m = np.arange(attack.num_others + 1)
    pmf = (
        stats.binom.pmf(m, attack.num_others, attack.others_rate)
        if attack.num_others
        else np.ones(1)
    )
    keep = pmf > _PMF_FLOOR
    m, pmf = m[keep], pmf[keep] / pmf[keep].sum()

    def inv(batch: NDArray) -> NDArray:  # lr / divisor, 0 for a skipped empty batch
        return np.asarray(arithmetic.step_scale(batch), dtype=np.float64)

    c, s = arithmetic.clipping_norm, arithmetic.noise_std
    w_out, w_in = inv(m), inv(m + 1)
    out = np.empty(trials)
    for lo, hi in _chunks(trials, 2 * m.size):
        size = hi - lo
        if not inside:
            n0 = rng.multinomial(steps, pmf, size=size)
            n1 = np.zeros_like(n0)
        elif isinstance(attack.insertion, PoissonInsertion):
            q = attack.insertion.sample_rate
            both = rng.multinomial(steps, np.concatenate([(1 - q) * pmf, q * pmf]), size=size)
            n0, n1 = both[:, : m.size], both[:, m.size :]
        else:
            assert isinstance(attack.insertion, PeriodicInsertion)
            k = int(attack.insertion.count(rng, 1, steps)[0])
            n0 = rng.multinomial(steps - k, pmf, size=size)
            n1 = rng.multinomial(k, pmf, size=size)
        signal = c * (n1 @ w_in)
        variance = s**2 * (n0 @ w_out**2 + n1 @ w_in**2)
        out[lo:hi] = signal + np.sqrt(variance) * rng.standard_normal(size)
    return out


# ---------------------------------------------------------------------------------------
# A_S^{h*}: worst-case landscape after one insertion.
# ---------------------------------------------------------------------------------------


def simulate_worst_case_landscape(
    attack: WorstCaseLandscape,
    *,
    noise_multiplier: float,
    steps: int,
    trials: int,
    rng: np.random.Generator,
    canary_in: bool,
) -> NDArray[np.float64]:
    """Trajectories theta_1..theta_T of A_S^{h*}, shape ``(trials, steps)`` (score: column t-1).

    ``theta_1 = b C + sigma C Z_1``; ``theta_{t+1} = theta_t - (B g(theta_t) + sigma C Z) / B``
    with ``g = -C s(theta)`` (:class:`WorstCaseLandscape`). A nonlinear Markov chain: no
    closed form, so this is the literal path, vectorised over trials.
    """
    _check_type("attack", attack, WorstCaseLandscape)
    sigma = check_noise_multiplier(noise_multiplier)
    t = check_int("steps", steps, minimum=1)
    n = check_int("trials", trials, minimum=1)
    check_rng(rng)
    inside = _check_bool("canary_in", canary_in)
    c, b = attack.clipping_norm, attack.batch_size
    out = np.empty((n, t))
    theta = -(attack.canary_gradient() if inside else 0.0) + sigma * c * rng.standard_normal(n)
    out[:, 0] = theta
    for step in range(1, t):
        summed = b * attack.record_gradients(theta)  # B identical records, norm C each
        theta = theta - (summed + sigma * c * rng.standard_normal(n)) / b
        out[:, step] = theta
    return out


# ---------------------------------------------------------------------------------------
# Malicious data set (last-iterate paper, Appendix C).
# ---------------------------------------------------------------------------------------


def simulate_malicious_dataset(
    attack: MaliciousDataset,
    arithmetic: DPSGDArithmetic,
    *,
    trials: int,
    rng: np.random.Generator,
    canary_in: bool,
    method: MaliciousMethod = "analytic",
    return_models: bool = False,
) -> NDArray[np.float64]:
    """Scores (or final models, ``return_models=True``, shape ``(trials, T)``) of the attack.

    Literal path: T steps of DP-SGD on theta in R^T with the repeaters' and the canary's
    gradients (:class:`MaliciousDataset`), clipped, summed (N repeaters, all in every batch),
    noised, divided; memory ``chunk x T``, time ``trials x T^2``. Analytic path (constant
    divisor, repeaters never clipped: ``N >= attack.min_unclipped_repeaters(sigma)``, so
    exact up to an event of probability below ``2 T^2 Phi(-10)``): draws each coordinate's
    record directly: ``y_j = b_j + sigma Z_j``, sign ``[y_j >= tau]``, flipped by the
    ``T - 2 - j`` re-thresholds with the exact two-state chain, final value
    ``U (+-BIG + sigma Z)``; the last coordinate is ``U (b + sigma Z)``. Time ``trials x T``.
    Counts path (scores only, same conditions): the score depends on the model only through
    the number of decoded records equal to 1 among the coordinates sharing a presence
    probability (one group for Poisson insertion) and the last coordinate; each count is
    drawn from its exact law (Poisson-binomial of
    :meth:`MaliciousDataset.decoded_probabilities`, flips included) by inversion. Time
    ``trials`` (``benchmarks/bench_malicious_counts.py``).
    """
    _check_type("attack", attack, MaliciousDataset)
    _check_type("arithmetic", arithmetic, DPSGDArithmetic)
    n = check_int("trials", trials, minimum=1)
    check_rng(rng)
    inside = _check_bool("canary_in", canary_in)
    if method not in ("analytic", "literal", "counts"):
        raise ValueError(f"`method` must be 'analytic', 'literal' or 'counts', got {method!r}.")
    how = method
    if not isinstance(return_models, bool):
        raise TypeError(f"`return_models` must be a bool, got {return_models!r}.")
    if how == "counts" and return_models:
        raise ValueError("method='counts' draws scores only; use return_models=False.")
    t = attack.steps
    if how != "literal":
        if arithmetic.normalisation == "realised":
            raise ValueError(
                f"method={how!r} needs a constant divisor (normalisation 'sum' or 'expected'); "
                "use method='literal' for 'realised'."
            )
        need = attack.min_unclipped_repeaters(arithmetic.noise_multiplier)
        if attack.num_repeaters < need:
            raise ValueError(
                f"`num_repeaters` must be >= {need:.1f} for method={how!r} (repeaters never "
                f"clipped), got {attack.num_repeaters}; use method='literal' to simulate clipping."
            )
    if how == "counts":
        return _malicious_counts(attack, arithmetic.noise_multiplier, n, rng, inside)
    out = np.empty((n, t)) if return_models else np.empty(n)
    for lo, hi in _chunks(n, 3 * t):
        size = hi - lo
        if how == "literal":
            models = _malicious_literal(attack, arithmetic, size, rng, inside)
        else:
            models = _malicious_analytic(attack, arithmetic, size, rng, inside)
        out[lo:hi] = models if return_models else attack.score(models, arithmetic)
    return out


def _presence(
    attack: MaliciousDataset, rng: np.random.Generator, trials: int, inside: bool
) -> NDArray:
    if not inside:
        return np.zeros((trials, attack.steps), dtype=bool)
    return attack.insertion.mask(rng, trials, attack.steps)


def _malicious_literal(
    attack: MaliciousDataset,
    arithmetic: DPSGDArithmetic,
    trials: int,
    rng: np.random.Generator,
    inside: bool,
) -> NDArray[np.float64]:
    t, big_n = attack.steps, attack.num_repeaters
    theta = np.zeros((trials, t))
    for step in range(t):
        repeater = arithmetic.clip(attack.repeater_gradient(theta, step, arithmetic))
        summed = big_n * repeater  # N identical repeaters, all in the batch
        present = (
            attack.insertion.draw_step(rng, step, trials) if inside else np.zeros(trials, bool)
        )
        canary = arithmetic.clip(attack.canary_gradient(step, arithmetic))
        summed += present[:, None] * canary[None, :]
        noisy = summed + arithmetic.noise_std * rng.standard_normal((trials, t))
        batch = big_n + present.astype(np.int64)
        theta = theta - np.asarray(arithmetic.step_scale(batch)).reshape(-1, 1) * noisy
    return theta


def _malicious_analytic(
    attack: MaliciousDataset,
    arithmetic: DPSGDArithmetic,
    trials: int,
    rng: np.random.Generator,
    inside: bool,
) -> NDArray[np.float64]:
    t, sigma, big = attack.steps, arithmetic.noise_multiplier, attack.big_value
    b = _presence(attack, rng, trials, inside).astype(np.float64)
    y = b + sigma * rng.standard_normal((trials, t))  # each step's record, in units of U
    x = np.empty((trials, t))
    x[:, -1] = y[:, -1]
    if t > 1:
        sign = y[:, :-1] >= attack.last_threshold  # decided at step j + 1
        # T - 2 - j re-thresholds of +-BIG + sigma Z at t_past: a two-state chain.
        p_down, p_up = attack.flip_probabilities(sigma)  # + -> -, - -> +
        n_flips = np.arange(t - 2, -1, -1, dtype=np.float64)
        if p_down + p_up > 0:
            lam = (1.0 - p_down - p_up) ** n_flips
            pi = p_up / (p_down + p_up)
            prob_plus = np.where(sign, pi + (1 - pi) * lam, pi * (1 - lam))
            sign = rng.random((trials, t - 1)) < prob_plus
        x[:, :-1] = np.where(sign, big, -big) + sigma * rng.standard_normal((trials, t - 1))
    return attack.unit(arithmetic) * x


def _poisson_binomial_pmf(probabilities: NDArray[np.float64]) -> NDArray[np.float64]:
    """pmf of a sum of independent Bernoulli(p_j), by successive convolution."""
    pmf = np.ones(1)
    for p in probabilities:
        pmf = np.convolve(pmf, [1.0 - p, p])
    return pmf


def _malicious_counts(
    attack: MaliciousDataset,
    sigma: float,
    trials: int,
    rng: np.random.Generator,
    inside: bool,
) -> NDArray[np.float64]:
    presence = attack.insertion.presence_probabilities(attack.steps)
    w1, w0 = attack.record_weights(sigma)
    absent = attack.decoded_probabilities(sigma, present=False)
    present = attack.decoded_probabilities(sigma, present=True)
    out = np.zeros(trials)
    for p in np.unique(presence[:-1]):
        group = presence[:-1] == p
        if not np.any(w1[group]) and not np.any(w0[group]):
            continue  # the score ignores these records (the canary is never there)
        probs = absent[group] if not inside else p * present[group] + (1 - p) * absent[group]
        cdf = np.cumsum(_poisson_binomial_pmf(probs))
        ones = np.minimum(np.searchsorted(cdf, rng.random(trials), side="right"), group.sum())
        out += ones * w1[group][0] + (group.sum() - ones) * w0[group][0]
    b = rng.random(trials) < presence[-1] if inside else np.zeros(trials, dtype=bool)
    last = b + sigma * rng.standard_normal(trials)
    return out + attack.last_llr(last, sigma)


# ---------------------------------------------------------------------------------------
# Audits of simulated scores.
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedAudit:
    """A Clopper-Pearson lower bound and a Gaussian-DP estimate from the same scores.

    Attributes:
        bound: ``kind="bound"``: assumption-free lower bound (Clopper-Pearson).
        estimate: ``kind="estimate"``: Gaussian-DP conversion (assumes a Gaussian trade-off).
    """

    bound: AuditResult
    estimate: AuditResult


def audit_scores(
    in_scores: NDArray[np.float64],
    out_scores: NDArray[np.float64],
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> SimulatedAudit:
    """Both audits of one pair of score arrays: ``ScoreAudit(in_scores, out_scores)``'s
    :meth:`~opacus_lastiterate.analysis.audit.ScoreAudit.clopper_pearson` (the bound) and
    :meth:`~opacus_lastiterate.analysis.audit.ScoreAudit.gaussian_dp` (the estimate), with the
    same arguments."""
    check_in_interval("confidence", confidence, 0.0, 1.0)
    audit = ScoreAudit(in_scores, out_scores)
    kw = {"delta": delta, "confidence": confidence, "threshold_strategy": threshold_strategy}
    return SimulatedAudit(
        bound=audit.clopper_pearson(**kw),  # type: ignore[arg-type]
        estimate=audit.gaussian_dp(**kw),  # type: ignore[arg-type]
    )
