"""Adversaries that also choose the other records' gradients or the loss landscape.

Each is a frozen dataclass describing the attack; :mod:`opacus_lastiterate.auditing.gradient_space.simulator`
runs it (vectorised over trials) and returns one score per trial, higher = "canary was in".

- :class:`AdversarialDataset`: a Dirac canary of norm C and ``num_others`` records whose
  gradient is zero (last-iterate paper, Section 3, Figure 3). The final model differs from
  theta_0 only in the canary's coordinate; score ``theta_0[c] - theta_T[c]``. With
  ``normalisation="sum"`` and Poisson insertion the score is, in units of lr * C,
  ``Binomial(T, q) + N(0, sigma^2 T)``: exactly the pair P vs Q of the heuristic.
- :class:`WorstCaseLandscape` (A_S^{h*}, Cebere et al. Section 6, Eq. 3): canary only at
  the first step, then a one-dimensional loss landscape whose B per-example gradients push
  theta away from the threshold h* = C / 2.
- :class:`MaliciousDataset` (last-iterate paper, Appendix C, Algorithms 2-4): T parameters;
  the canary writes C into coordinate t at step t, and N "repeater" records zero the
  not-yet-used coordinates (cancelling the noise there) and rewrite every past coordinate
  as +-BIG according to a threshold, so the final model stores one thresholded, once-noised
  record of every step. Score: the log-likelihood ratio of the decoded records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import special

from opacus_lastiterate.analysis._validation import (
    check_int,
    check_noise_multiplier,
    check_positive,
    check_real,
)
from opacus_lastiterate.auditing.gradient_space.arithmetic import DPSGDArithmetic
from opacus_lastiterate.auditing.gradient_space.canaries import DiracCanary
from opacus_lastiterate.auditing.gradient_space.insertion import Insertion, PoissonInsertion

__all__ = [
    "AdversarialDataset",
    "MaliciousDataset",
]


def _check_insertion(insertion: object) -> Insertion:
    if not isinstance(insertion, Insertion):
        raise TypeError(
            f"`insertion` must be a PoissonInsertion or PeriodicInsertion, got {insertion!r}."
        )
    return insertion


@dataclass(frozen=True)
class AdversarialDataset:
    """Dirac canary (norm C) plus ``num_others`` records with zero gradient.

    Attributes:
        insertion: when the canary is in the batch (Poisson at the training rate, or every
            k steps).
        num_others: records with zero gradient; they only matter for
            ``normalisation="realised"``, where each is in the batch independently with
            probability ``others_sample_rate`` and changes the divisor.
        others_sample_rate: Poisson rate of the other records (default: the canary's
            rate for Poisson insertion; required for periodic insertion with others).
    """

    insertion: Insertion
    num_others: int = 0
    others_sample_rate: float | None = None

    def __post_init__(self) -> None:
        _check_insertion(self.insertion)
        check_int("num_others", self.num_others)
        if self.others_sample_rate is not None:
            check_positive("others_sample_rate", self.others_sample_rate)
            if self.others_sample_rate > 1.0:
                raise ValueError(
                    f"`others_sample_rate` must be in (0, 1], got {self.others_sample_rate!r}."
                )

    @property
    def others_rate(self) -> float:
        """Sampling rate of the zero-gradient records."""
        if self.others_sample_rate is not None:
            return float(self.others_sample_rate)
        if isinstance(self.insertion, PoissonInsertion):
            return self.insertion.sample_rate
        if self.num_others == 0:
            return 0.0
        raise ValueError(
            "`others_sample_rate` is required with periodic insertion and num_others > 0."
        )

    def craft(
        self, arithmetic: DPSGDArithmetic, dimension: int = 1, coordinate: int = 0
    ) -> DiracCanary:
        """The canary: ``C`` on ``coordinate`` (any coordinate: the others never move)."""
        d = check_int("dimension", dimension, minimum=1)
        c = check_int("coordinate", coordinate)
        if c >= d:
            raise ValueError(f"`coordinate` must be in [0, {d - 1}], got {c}.")
        g = np.zeros(d)
        g[c] = arithmetic.clipping_norm
        return DiracCanary(gradient=g, coordinate=c)

@dataclass(frozen=True)
class WorstCaseLandscape:
    """A_S^{h*} (Cebere et al., Section 6): the canary at step 1 only, then a threshold landscape.

    One parameter, theta_0 = 0. Step 1 contains the canary (gradient -C, i.e. nabla* = C in
    the paper's sign) and noise only, undivided, as in Eq. (3)::

        theta_1 = b C + sigma C Z_1                      b = 1 with the canary, 0 without

    then for t >= 1 the B records (always in the batch) each have gradient ``-C s(theta_t)``
    with ``s = +1 if theta_t > h else -1`` (norm C, so clipping is exact), summed, noised and
    divided by B::

        theta_{t+1} = theta_t - (sum_i g_i + sigma C Z_{t+1}) / B = theta_t + C s(theta_t) - sigma C Z_{t+1} / B

    Sign: the paper prints g = +BC above h* in an update theta - (g + Z)/B, which pulls theta
    back towards h* (a mean-reverting walk that forgets the first step, and no longer tight
    at large B); we use the sign under which the landscape keeps the first step's decision
    ("maximally biases subsequent steps"), which reproduces the paper's findings. Score: theta_t.

    Attributes:
        batch_size: B, records in every batch after the first step.
        clipping_norm: C.
        threshold: h; default C / 2 (h*, the minimum-error test of N(0) vs N(C)).
    """

    batch_size: int
    clipping_norm: float = 1.0
    threshold: float | None = None

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size, minimum=1)
        check_positive("clipping_norm", self.clipping_norm)
        if self.threshold is not None:
            check_real("threshold", self.threshold)

    @property
    def h(self) -> float:
        """The landscape threshold (C / 2 unless given)."""
        return self.clipping_norm / 2 if self.threshold is None else float(self.threshold)

    def canary_gradient(self) -> float:
        """The crafted gradient at step 1, ``-C`` (descent then adds C)."""
        return -self.clipping_norm

    def record_gradients(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per-record gradient at ``theta`` (each of the B records): ``-C s(theta)``."""
        return np.where(np.asarray(theta) > self.h, -self.clipping_norm, self.clipping_norm)

    @staticmethod
    def score(theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Higher theta = "canary was in"."""
        return np.asarray(theta, dtype=np.float64)


@dataclass(frozen=True)
class MaliciousDataset:
    """Appendix C of the last-iterate paper: the final model stores every step's record.

    Parameters: theta in R^T, theta_0 = 0, steps t = 0..T-1. The canary's gradient at step
    t is ``-C e_t`` (Algorithm 2). N repeaters, in every batch, share the gradient
    ``r = (theta - target) * D / (lr N)`` (clipped like every record; the attack needs N
    large enough that it is not), so that their summed update moves theta to ``target``
    (Algorithm 3). With the unit U = lr C / D (D the divisor the repeaters assume: 1 for
    SGM, the expected batch size for EASGM, N for ASGM):

        target_j = 0                                           j >= t   (cancel noise)
        target_j = BIG U (2 [theta_j >= tau U] - 1)            j = t - 1 (record step t-1)
        target_j = BIG U (2 [theta_j >= t_past U] - 1)         j < t - 1 (keep the record)

    After T steps, coordinate j < T - 1 is ``+-BIG U`` plus one step of noise, +BIG iff
    ``b_j + sigma Z_j >= tau`` (b_j = canary present at step j) unless a later re-threshold
    flipped it (probability Phi(-(BIG - ``|t_past|``) / sigma) per step); coordinate T - 1 is
    ``U (b_{T-1} + sigma Z)``.

    Score (:meth:`score`): log-likelihood ratio of the decoded records d_j = [theta_j >= 0]
    (flips ignored) and of the last coordinate, with presence probability p_j:
    ``sum_j log P'(d_j) / P(d_j) + log(1 - p + p exp((2 x - 1) / (2 sigma^2)))``,
    P(d = 1) = Phi(-tau / sigma), P'(d = 1) = p Phi((1 - tau) / sigma) + (1 - p) Phi(-tau / sigma).

    Attributes:
        steps: T, also the number of parameters.
        num_repeaters: N.
        insertion: when the canary is in the batch (Poisson at the training rate in the paper).
        big_value: BIG, in units of U.
        last_threshold: tau, in units of U (the canary adds 1 unit).
        past_threshold: t_past, in units of U.
    """

    steps: int
    insertion: Insertion
    num_repeaters: int = 100_000
    big_value: float = 100.0
    last_threshold: float = 2.0
    past_threshold: float = 0.0

    def __post_init__(self) -> None:
        check_int("steps", self.steps, minimum=1)
        _check_insertion(self.insertion)
        check_int("num_repeaters", self.num_repeaters, minimum=1)
        check_positive("big_value", self.big_value)
        check_real("last_threshold", self.last_threshold)
        p = check_real("past_threshold", self.past_threshold)
        if abs(p) >= self.big_value:
            raise ValueError(f"`past_threshold` must be in (-big_value, big_value), got {p!r}.")

    def assumed_divisor(self, arithmetic: DPSGDArithmetic) -> float:
        """D: 1 (sum), the expected batch size (expected), N (realised)."""
        if arithmetic.normalisation == "realised":
            return float(self.num_repeaters)
        return float(arithmetic.divisor())

    def unit(self, arithmetic: DPSGDArithmetic) -> float:
        """U = lr C / D, the move of one canary insertion."""
        return (
            arithmetic.learning_rate * arithmetic.clipping_norm / self.assumed_divisor(arithmetic)
        )

    def canary_gradient(self, step: int, arithmetic: DPSGDArithmetic) -> NDArray[np.float64]:
        """``-C e_step`` (Algorithm 2)."""
        t = check_int("step", step)
        if t >= self.steps:
            raise ValueError(f"`step` must be in [0, {self.steps - 1}], got {t}.")
        g = np.zeros(self.steps)
        g[t] = -arithmetic.clipping_norm
        return g

    def targets(
        self, theta: NDArray[np.float64], step: int, arithmetic: DPSGDArithmetic
    ) -> NDArray[np.float64]:
        """Where the repeaters move theta at ``step`` (shape of ``theta``, ``(..., T)``)."""
        u = self.unit(arithmetic)
        target = np.zeros_like(theta)
        if step >= 1:
            target[..., : step - 1] = np.where(
                theta[..., : step - 1] >= self.past_threshold * u,
                self.big_value * u,
                -self.big_value * u,
            )
            target[..., step - 1] = np.where(
                theta[..., step - 1] >= self.last_threshold * u,
                self.big_value * u,
                -self.big_value * u,
            )
        return target

    def repeater_gradient(
        self, theta: NDArray[np.float64], step: int, arithmetic: DPSGDArithmetic
    ) -> NDArray[np.float64]:
        """One repeater's (unclipped) gradient ``(theta - target) D / (lr N)`` (Algorithm 3)."""
        d = self.assumed_divisor(arithmetic)
        return (
            (theta - self.targets(theta, step, arithmetic))
            * d
            / (arithmetic.learning_rate * self.num_repeaters)
        )

    def min_unclipped_repeaters(self, noise_multiplier: float, tail: float = 10.0) -> float:
        """N above which no repeater is clipped unless some ``|Z|`` exceeds ``tail``.

        ``||theta - target|| / U <= sqrt((BIG + max(|tau|, 1) + tail sigma)^2 + T (tail sigma)^2)``
        when every noise draw is below ``tail`` standard deviations.
        """
        s = check_noise_multiplier(noise_multiplier) * check_positive("tail", tail)
        lead = self.big_value + max(abs(self.last_threshold), 1.0) + abs(self.past_threshold) + s
        return math.sqrt(lead**2 + self.steps * s**2)

    def flip_probabilities(self, noise_multiplier: float) -> tuple[float, float]:
        """``(p_down, p_up)``: one re-threshold at t_past turns a stored +BIG into -BIG / a
        -BIG into +BIG (``Phi((t_past - BIG) / sigma)``, ``Phi((-BIG - t_past) / sigma)``)."""
        sigma = check_noise_multiplier(noise_multiplier)
        p_down = float(special.ndtr((self.past_threshold - self.big_value) / sigma))
        p_up = float(special.ndtr((-self.big_value - self.past_threshold) / sigma))
        return p_down, p_up

    def decoded_probabilities(self, noise_multiplier: float, present: bool) -> NDArray[np.float64]:
        """``P(d_j = 1)``, j < T - 1, for a canary present (or not) at step j: shape ``(T - 1,)``.

        ``d_j = [theta_T[j] >= 0]``. The record is +BIG with probability
        ``Phi((b - tau) / sigma)``, then ``T - 2 - j`` re-thresholds flip it (two-state chain
        of :meth:`flip_probabilities`), then the last step's noise decodes +BIG as 1 with
        probability ``Phi(BIG / sigma)`` (and -BIG with ``Phi(-BIG / sigma)``). Records are
        independent across j given the presence pattern.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        b = 1.0 if present else 0.0
        plus = np.full(self.steps - 1, special.ndtr((b - self.last_threshold) / sigma))
        p_down, p_up = self.flip_probabilities(sigma)
        if p_down + p_up > 0:
            lam = (1.0 - p_down - p_up) ** np.arange(self.steps - 2, -1, -1, dtype=np.float64)
            pi = p_up / (p_down + p_up)
            plus = plus * (pi + (1 - pi) * lam) + (1 - plus) * pi * (1 - lam)
        keep = special.ndtr(self.big_value / sigma)
        return np.asarray(plus * keep + (1 - plus) * (1 - keep), dtype=np.float64)

    def record_weights(
        self, noise_multiplier: float
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(w1, w0)``, shape ``(T - 1,)``: the score's log-likelihood ratio of ``d_j = 1`` and
        ``d_j = 0`` (flips ignored; class docs); 0 where the canary is never present."""
        sigma = check_noise_multiplier(noise_multiplier)
        p = self.insertion.presence_probabilities(self.steps)[:-1]
        a0 = special.ndtr(-self.last_threshold / sigma)
        a1 = special.ndtr((1.0 - self.last_threshold) / sigma)
        w1 = np.log(p * a1 + (1 - p) * a0) - math.log(a0)
        w0 = np.log(p * (1 - a1) + (1 - p) * (1 - a0)) - math.log1p(-a0)
        return w1, w0

    def last_llr(self, last: NDArray[np.float64], noise_multiplier: float) -> NDArray[np.float64]:
        """The score's term for the last coordinate x (in units of U):
        ``log(1 - p + p exp((2 x - 1) / (2 sigma^2)))``, p its presence probability."""
        sigma = check_noise_multiplier(noise_multiplier)
        p_last = float(self.insertion.presence_probabilities(self.steps)[-1])
        with np.errstate(divide="ignore"):
            return np.logaddexp(
                math.log1p(-p_last) if p_last < 1 else -np.inf,
                (math.log(p_last) if p_last > 0 else -np.inf)
                + (2 * np.asarray(last, dtype=np.float64) - 1) / (2 * sigma**2),
            )

    def score(self, final: NDArray[np.float64], arithmetic: DPSGDArithmetic) -> NDArray[np.float64]:
        """Log-likelihood ratio of the decoded final model (class docs), shape ``final.shape[:-1]``."""
        x = np.asarray(final, dtype=np.float64) / self.unit(arithmetic)
        if x.shape[-1] != self.steps:
            raise ValueError(f"`final` must have last axis {self.steps}, got shape {x.shape}.")
        sigma = arithmetic.noise_multiplier
        w1, w0 = self.record_weights(sigma)
        llr = np.where(x[..., :-1] >= 0.0, w1, w0).sum(axis=-1)
        return llr + self.last_llr(x[..., -1], sigma)
