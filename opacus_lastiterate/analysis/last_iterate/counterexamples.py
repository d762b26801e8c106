"""Analysers for the known counterexamples to the last-iterate heuristic.

``docs/last_iterate.md``, "Known counterexamples", and Section 4 of Steinke et al., "The Last
Iterate Advantage" (arXiv 2410.06186):

* **Linear loss + quadratic regulariser** alpha m^2 / 2 (eta = 1, d = 1). Each step
  multiplies the model by (1 - alpha), so the canary and the noise of the step i-th from
  the end enter the final model with weight (1 - alpha)^(i-1):

      P = N(sum_{i<=T} (1 - alpha)^(i-1) Bernoulli(q), s^2),  Q = N(0, s^2),
      s^2 = sigma^2 sum_{i<=T} (1 - alpha)^(2(i-1)).

  alpha = 0 is the linear case (the heuristic), alpha = 1 is one step; in between the value
  can exceed both (paper: T = 3, q = 0.1, sigma = 1, delta = 1e-6 gives 2.222, 2.182 and
  at least 2.274 for alpha = 0, 1, 0.5). :func:`quadratic_regulariser_epsilon` computes it
  exactly by enumerating the 2^T support (T <= 20), or with the paper's rounding for large T.
* **Zeroing regulariser** r(m) = ||m||^2 / (2 eta): the final model is one step of DP-SGD,
  so its epsilon is eps_1 (:func:`zeroing_regulariser_epsilon`). The robust variant
  ``privacy_model("robust_heuristic", run)`` (max over the last t <= T steps) covers it and
  every regulariser that forgets all but the last t steps; it is the number to report beside
  eps_T.
* **Non-monotonicity**: more steps add signal and noise, so eps_T can be below eps_t for
  some t < T. :func:`heuristic_monotonicity` reports where.

The shifting and malicious-data-set counterexamples make the standard composition bound
tight; they need no analyser beyond :mod:`opacus_lastiterate.analysis.baselines.composition`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_noise_multiplier,
    check_positive,
    check_sample_rate,
    check_steps,
)
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.last_iterate.suffix_maximum import certified_suffix_maximum
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_epsilon_result,
    weighted_sum_distribution,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, as_segments, total_steps

__all__ = [
    "MonotonicityCheck",
    "QuadraticResult",
    "heuristic_monotonicity",
    "quadratic_regulariser_epsilon",
    "zeroing_regulariser_epsilon",
]

PAPER_FLOOR = 0.0005  # support values below this are rounded up to it (paper, Section 4.2)
PAPER_RATIO = 1.05  # then every value is rounded up to the next integer power of 1.05
EXACT_MAX_STEPS = 20  # largest T for which the 2^T support is enumerated
_AUTO_EXACT_STEPS = 16  # method="auto" enumerates up to here


# -- quadratic regulariser -------------------------------------------------------------------


def quadratic_regulariser_weights(steps: int, alpha: float) -> np.ndarray:
    """Weights (1 - alpha)^(T - t) of steps t = 1..T (oldest first; the last step has 1)."""
    n = check_steps(steps)
    a = check_in_interval("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
    return (1.0 - a) ** np.arange(n - 1, -1, -1, dtype=float)


def _check(delta: float, steps: int, sample_rate: float, noise_multiplier: float, alpha: float):
    return (
        check_delta(delta),
        check_steps(steps, minimum=1),
        check_sample_rate(sample_rate),
        check_noise_multiplier(noise_multiplier),
        check_in_interval("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False),
    )


def _enumerated_pair(weights: np.ndarray, q: float, scale: float) -> ShiftedGaussianMixture:
    """All 2^T subset sums of the weights with their probabilities (exact)."""
    values, log_p = np.zeros(1), np.zeros(1)
    log_q = math.log(q)
    log_1mq = math.log1p(-q) if q < 1.0 else -math.inf
    for w in weights:
        values = np.concatenate([values, values + w])
        log_p = np.concatenate([log_p + log_1mq, log_p + log_q])
    return ShiftedGaussianMixture(values, log_p, scale)


def _paper_pair(
    weights: np.ndarray, q: float, scale: float, rounding: str
) -> ShiftedGaussianMixture | None:
    """The paper's rounding of X = sum_t w_t Bernoulli(q) (up), or its mirror image (down).

    X is first put on an additive grid of spacing h = 0.0005 / T with each weight rounded
    up (down), which moves X by at most 0.0005 and is computed exactly by convolution; each
    grid value v > 0 then goes up to the next power of 1.05 at or above max(v, 0.0005)
    (down: to the power at or below v, and to 0 when v < 0.0005). Up is an upper bound on
    the exact epsilon and down a lower bound (Lemma 4.5 of CCGST24 via the coupling
    X_down <= X <= X_up).
    """
    h = PAPER_FLOOR / weights.size
    x = weights / h
    if rounding == "up":  # strict: "up" never moves a value down
        units = np.ceil(x).astype(np.int64)
    else:
        units = np.floor(x).astype(np.int64)
    offset, pmf, dropped = weighted_sum_distribution(units, q)
    values = h * (offset + np.arange(pmf.size))
    positive = values > 0
    level = np.zeros(values.size, dtype=np.int64)  # level 0 is the value 0
    log_ratio = math.log(PAPER_RATIO)
    if rounding == "up":
        exponent = np.ceil(np.log(np.maximum(values[positive], PAPER_FLOOR)) / log_ratio)
    else:
        big = values >= PAPER_FLOOR
        positive = big
        exponent = np.floor(np.log(values[big]) / log_ratio)
    if exponent.size == 0:
        return None
    e_min = int(exponent.min())
    level[positive] = exponent.astype(np.int64) - e_min + 1
    mass = np.bincount(level, weights=pmf)
    shifts = np.r_[0.0, PAPER_RATIO ** np.arange(e_min, e_min + mass.size - 1, dtype=float)]
    keep = mass > 0
    with np.errstate(divide="ignore"):
        log_mass = np.log(mass[keep])
    return ShiftedGaussianMixture(
        shifts[keep], log_mass, scale, dropped if rounding == "up" else 0.0
    )


def quadratic_regulariser_pair(
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    alpha: float,
    method: str = "exact",
    rounding: str = "up",
) -> ShiftedGaussianMixture | None:
    """The (P, Q) pair of the quadratic-regulariser example (module docstring).

    ``method="exact"`` enumerates the 2^T support (T <= 20); ``"paper"`` applies the paper's
    rounding (``rounding="up"``, an upper bound, or ``"down"``, a lower bound). None if P == Q.
    """
    n = check_steps(steps, minimum=1)
    q = check_sample_rate(sample_rate)
    sigma = check_noise_multiplier(noise_multiplier)
    w = quadratic_regulariser_weights(n, alpha)
    w = w[w > 0]
    scale = sigma * math.sqrt(float(np.sum(w * w)))
    if method == "exact":
        if n > EXACT_MAX_STEPS:
            raise ValueError(f"`steps` must be <= {EXACT_MAX_STEPS} for method='exact', got {n}.")
        return _enumerated_pair(w, q, scale)
    if method == "paper":
        if rounding not in ("up", "down"):
            raise ValueError(f"`rounding` must be 'up' or 'down', got {rounding!r}.")
        return _paper_pair(w, q, scale, rounding)
    raise ValueError(f"`method` must be 'exact' or 'paper', got {method!r}.")


@dataclass(frozen=True)
class QuadraticResult:
    """Epsilon of the quadratic-regulariser example.

    ``epsilon`` is exact (``method="exact"`` or alpha in {0, 1}) or an upper bound;
    ``epsilon_lower`` is a lower bound (equal to ``epsilon`` when exact).
    """

    epsilon: float
    epsilon_lower: float
    method: str
    steps: int
    sample_rate: float
    noise_multiplier: float
    alpha: float
    delta: float

    def __float__(self) -> float:
        return float(self.epsilon)


def quadratic_regulariser_epsilon(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    alpha: float,
    method: str = "auto",
    accuracy: float = 1e-3,
) -> QuadraticResult:
    """Epsilon of linear loss + quadratic regulariser alpha m^2 / 2 after T steps.

    Args:
        delta: target delta in (0, 1).
        steps: T >= 1.
        sample_rate: q in (0, 1].
        noise_multiplier: sigma > 0.
        alpha: regulariser coefficient in [0, 1] (learning rate 1).
        method: ``"exact"`` (2^T enumeration, T <= 20); ``"paper"`` (Section 4.2 rounding:
            values below 0.0005 up to 0.0005, then up to the next power of 1.05; returns that
            upper bound and the mirror-image lower bound); ``"grid"`` (the weighted heuristic
            with certified relative ``accuracy``); ``"auto"``: alpha in {0, 1} by the exact
            binomial path, else exact for T <= 16 and grid beyond (the paper's rounding
            keeps an additive 0.0005 / T grid whose size grows quadratically in T).
        accuracy: for ``"grid"`` only.
    """
    d, n, q, sigma, a = _check(delta, steps, sample_rate, noise_multiplier, alpha)
    if method not in ("auto", "exact", "paper", "grid"):
        raise ValueError(
            f"`method` must be one of 'auto', 'exact', 'paper', 'grid', got {method!r}."
        )

    def result(eps: float, lower: float, used: str) -> QuadraticResult:
        return QuadraticResult(float(eps), float(lower), used, n, q, sigma, a, d)

    if method == "auto":
        if a in (0.0, 1.0):
            run = DPSGDRun.constant(
                steps=n if a == 0.0 else 1, sample_rate=q, noise_multiplier=sigma
            )
            eps = privacy_model("heuristic", run).epsilon(d)
            return result(eps, eps, "linear" if a == 0.0 else "one-step")
        method = "exact" if n <= _AUTO_EXACT_STEPS else "grid"
    if method == "grid":
        r = weighted_heuristic_epsilon_result(
            d,
            weights=quadratic_regulariser_weights(n, a),
            sample_rates=q,
            noise_multipliers=sigma,
            accuracy=accuracy,
        )
        return result(r.value, r.lower_bound, "grid")
    kwargs = dict(steps=n, sample_rate=q, noise_multiplier=sigma, alpha=a, method=method)
    up = quadratic_regulariser_pair(**kwargs)  # type: ignore[arg-type]
    eps = 0.0 if up is None else up.epsilon(d)
    if method == "exact":
        return result(eps, eps, "exact")
    down = quadratic_regulariser_pair(**kwargs, rounding="down")  # type: ignore[arg-type]
    return result(eps, 0.0 if down is None else down.epsilon(d), "paper")


@dataclass(frozen=True)
class QuadraticComparison:
    """The quadratic-regulariser epsilon beside the heuristic's numbers for the same (T, q, sigma).

    ``epsilon_linear`` = eps_T (alpha = 0, the heuristic), ``epsilon_one_step`` = eps_1
    (alpha = 1, also the zeroing regulariser), ``epsilon_robust`` = max_{t<=T} eps_t,
    attained at ``robust_steps``.
    """

    quadratic: QuadraticResult
    epsilon_linear: float
    epsilon_one_step: float
    epsilon_robust: float
    robust_steps: int

    @property
    def ratio_to_robust(self) -> float:
        """eps_quadratic / max_{t<=T} eps_t (the quantity of the paper's Figure 5)."""
        return self.quadratic.epsilon / self.epsilon_robust if self.epsilon_robust > 0 else math.inf

    @property
    def exceeds_heuristic(self) -> bool:
        """Whether the quadratic example beats the plain heuristic eps_T."""
        return self.quadratic.epsilon > self.epsilon_linear


def quadratic_regulariser_comparison(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    alpha: float = 0.5,
    method: str = "auto",
) -> QuadraticComparison:
    """Quadratic-regulariser epsilon with eps_T, eps_1 and max_{t<=T} eps_t (for reports)."""
    quad = quadratic_regulariser_epsilon(
        delta,
        steps=steps,
        sample_rate=sample_rate,
        noise_multiplier=noise_multiplier,
        alpha=alpha,
        method=method,
    )
    mono = heuristic_monotonicity(
        quad.delta,
        steps=quad.steps,
        sample_rate=quad.sample_rate,
        noise_multiplier=quad.noise_multiplier,
    )
    one_step = DPSGDRun.constant(
        steps=1, sample_rate=quad.sample_rate, noise_multiplier=quad.noise_multiplier
    )
    one = privacy_model("heuristic", one_step).epsilon(quad.delta)
    return QuadraticComparison(
        quad, mono.epsilon_at_steps, one, mono.max_epsilon_bound, mono.argmax_steps
    )


# -- zeroing regulariser and the robust variant -------------------------------------------------


def zeroing_regulariser_epsilon(
    delta: float, *, sample_rate: float, noise_multiplier: float
) -> float:
    """Epsilon of the final model under r(m) = ||m||^2 / (2 eta): one step of DP-SGD, eps_1.

    Whatever T is, the final model equals the last step alone; the robust variant
    ``privacy_model("robust_heuristic", run)`` (max over t <= T) is never below this.
    """
    run = DPSGDRun.constant(steps=1, sample_rate=sample_rate, noise_multiplier=noise_multiplier)
    return privacy_model("heuristic", run).epsilon(delta)


# -- non-monotonicity -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MonotonicityCheck:
    """eps_T against max_{t<=T} eps_t (eps_t: the heuristic for the last t steps).

    ``max_epsilon`` is attained: it is eps_t at t = ``argmax_steps`` (ties go to the larger
    t). ``max_epsilon_bound`` is the certified upper bound on every eps_t
    (:mod:`.suffix_maximum`, within a relative 1e-6 of ``max_epsilon``). ``non_monotone`` is
    True when some shorter suffix has a strictly larger epsilon, i.e. the heuristic at the
    requested T is below what a zeroing regulariser could expose.
    """

    steps: int
    delta: float
    epsilon_at_steps: float
    max_epsilon: float
    argmax_steps: int
    max_epsilon_bound: float

    @property
    def non_monotone(self) -> bool:
        return self.max_epsilon > self.epsilon_at_steps


def _scan(segments, delta: float) -> MonotonicityCheck:
    """eps_T against the certified maximum of :func:`suffix_maximum.certified_suffix_maximum`."""
    best = certified_suffix_maximum(segments, delta)
    n = total_steps(segments)
    if best.argmax_steps == n:
        at_steps = best.attained
    else:
        at_steps = LastIterateHeuristic(segments).epsilon(delta)
    return MonotonicityCheck(n, delta, at_steps, best.attained, best.argmax_steps, best.epsilon)


def heuristic_monotonicity(
    delta: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> MonotonicityCheck:
    """Whether T lies where the heuristic is non-monotone (eps_T < max_{t<=T} eps_t)."""
    d = check_delta(delta)
    segments = as_segments([(noise_multiplier, sample_rate, check_steps(steps))])
    return _scan(segments, d)


# -- calibration helper --------------------------------------------------------------------------


def one_step_noise_multiplier(epsilon: float, delta: float, sample_rate: float) -> float:
    """The sigma for which one step of DP-SGD at rate q is exactly (epsilon, delta)-DP
    (used by the paper's Figure 5 sweep). Requires delta < q (otherwise no sigma is needed)."""
    eps = check_positive("epsilon", epsilon)
    d = check_delta(delta)
    q = check_sample_rate(sample_rate)
    if d >= q:
        raise ValueError(
            f"`delta` must be below `sample_rate` ({q!r}) for a calibration, got {d!r}."
        )

    def gap(log_sigma: float) -> float:
        return (
            privacy_model(
                "heuristic",
                DPSGDRun.constant(steps=1, sample_rate=q, noise_multiplier=math.exp(log_sigma)),
            ).epsilon(d)
            - eps
        )

    lo, hi = -1.0, 1.0
    while gap(lo) < 0:
        lo -= 1.0
    while gap(hi) > 0:
        hi += 1.0
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-14, rtol=1e-13))
