"""Exact privacy of the one-dimensional audit processes, by density evolution on a grid.

For :class:`~opacus_lastiterate.auditing.WorstCaseLandscape` (A_S^{h*}, Cebere, Bellet,
Papernot, "Tighter Privacy Auditing of DP-SGD in the Hidden State Threat Model",
arXiv:2405.14457, Section 6) the released theta_t is a nonlinear Markov chain

    theta_1 = b C + sigma C Z_1,     theta_{t+1} = theta_t + C s(theta_t) - (sigma C / B) Z_{t+1}

(s = +1 above h, -1 below). Its law with (b = 1) and without (b = 0) the canary is evolved
on a grid of cells of width ``grid_step`` (a multiple of C / 2 divides exactly, so the +-C
drift is a whole number of cells and h is a cell boundary); each noise step convolves the
cell masses with the cell-integrated Gaussian. The two discrete laws then give the exact
(eps, delta) curve of the *discretised* process; the discretisation error is what changes
when the grid is refined (:func:`worst_case_landscape_epsilons` reports it) and is checked at
t = 1 against the closed form (theta_1 is Gaussian: eps_1 = the GDP epsilon of mu = 1/sigma).

For :class:`~opacus_lastiterate.auditing.MaliciousDataset` (last-iterate paper, "The Last
Iterate Advantage", arXiv:2410.06186, Appendix C) the final model is, up to independent
noise, the vector of decoded records d_j (j < T - 1) and the last coordinate x: with the
canary's presence probability p on every step that can hold it, the records are
independent Bernoulli(P1) (with) / Bernoulli(P0) (without), ``P_b = p Phi((1 - tau) / sigma) +
(1 - p) Phi(-tau / sigma)`` resp. ``Phi(-tau / sigma)``, and ``x ~ (1 - p) N(0, sigma^2) +
p N(1, sigma^2)`` / ``N(0, sigma^2)``. The privacy loss is ``l(K) + l_x(x)`` with K the
number of ones (Binomial), and ``l_x`` increasing in x, so the set where it exceeds a level
is ``x >= a_K`` for each K in closed form; the hockey-stick divergence

    delta(eps) = sum_K [P(K) P(x >= a_K) - e^eps Q(K) Q(x >= a_K)]        (a_K = a_K(eps))

(and the reverse one) is a finite sum of Gaussian tails, evaluated in floating point, and
eps(delta) is found by root-finding (:func:`malicious_dataset_epsilon`). This is the best
epsilon any audit of the construction can certify at ``delta``: ``eps(delta) = sup_S
log((P(S) - delta) / Q(S))`` over tests S. The records' re-threshold flips and the decoding
error (:meth:`MaliciousDataset.decoded_probabilities`) and the repeaters' clipping event are
left out; a bound eta on their probability (about 1e-19 at BIG = 100) enters the stated
error, with the root-finding tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import brentq
from scipy.signal import fftconvolve
from scipy.special import gammaln, log_ndtr, ndtr

from opacus_lastiterate.analysis._bisection import monotone_boundary
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_int,
    check_noise_multiplier,
)
from opacus_lastiterate.auditing.gradient_space.adversaries import (
    MaliciousDataset,
    WorstCaseLandscape,
)
from opacus_lastiterate.auditing.gradient_space.arithmetic import DPSGDArithmetic

__all__ = [
    "ExactEpsilon",
    "malicious_dataset_epsilon",
    "malicious_dataset_test_rates",
]

_SPAN_SD = 12.0  # grid and kernel half-widths, in standard deviations


def _delta_at(p: NDArray[np.float64], q: NDArray[np.float64], eps: float) -> float:
    """sum max(0, p - e^eps q): the hockey-stick divergence of two discrete laws."""
    return float(np.sum(np.maximum(p - math.exp(eps) * q, 0.0)))


def discrete_epsilon(
    p: NDArray[np.float64], q: NDArray[np.float64], delta: float, *, tol: float = 1e-9
) -> float:
    """Smallest eps with both hockey-stick divergences (P||Q, Q||P) <= delta, by bisection."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)

    def worst(eps: float) -> float:
        return max(_delta_at(p, q, eps), _delta_at(q, p, eps))

    if worst(0.0) <= delta:
        return 0.0
    return monotone_boundary(lambda eps: worst(eps) > delta, rtol=tol, cap=1e3)[1]


@dataclass(frozen=True)
class ExactEpsilons:
    """Exact epsilons of theta_1..theta_T (index t - 1) and their discretisation error.

    Attributes:
        epsilons: eps_t at the finer grid.
        error: ``|eps_t(grid) - eps_t(grid / 2)|``, per step (the stated error).
        lost_mass: probability mass that left the grid (added to neither law; < 1e-12 here).
    """

    epsilons: NDArray[np.float64]
    error: NDArray[np.float64]
    lost_mass: float


def _evolve(
    attack: WorstCaseLandscape, sigma: float, steps: int, dx: float, delta: float
) -> tuple[NDArray[np.float64], float]:
    c, b = attack.clipping_norm, attack.batch_size
    shift = round(c / dx)
    h_cells = attack.h / dx
    if abs(shift * dx - c) > 1e-9 * c or abs(h_cells - round(h_cells)) > 1e-9:
        raise ValueError(
            f"`grid_step` must divide the clipping norm {c} and the threshold {attack.h}, got {dx}."
        )
    s_step = sigma * c / b
    sd_total = math.sqrt((sigma * c) ** 2 + (steps - 1) * s_step**2)
    half = c * steps + _SPAN_SD * sd_total + c
    n_half = math.ceil(half / dx)
    centres = (np.arange(-n_half, n_half) + 0.5) * dx  # h = 0.5 C sits on a boundary
    up = centres > attack.h

    def gaussian_masses(mean: float, sd: float) -> NDArray[np.float64]:
        edges = np.r_[centres - dx / 2, centres[-1] + dx / 2]
        return np.diff(ndtr((edges - mean) / sd))

    k_half = max(1, math.ceil(_SPAN_SD * s_step / dx))
    offsets = np.arange(-k_half, k_half + 1) * dx
    kernel = ndtr((offsets + dx / 2) / s_step) - ndtr((offsets - dx / 2) / s_step)
    laws = [gaussian_masses(c, sigma * c), gaussian_masses(0.0, sigma * c)]
    eps = [discrete_epsilon(laws[0], laws[1], delta)]
    lost = 0.0
    for _ in range(1, steps):
        new = []
        for law in laws:
            moved = np.zeros_like(law)
            moved[shift:] += np.where(up, law, 0.0)[:-shift]  # +C above h
            moved[:-shift] += np.where(up, 0.0, law)[shift:]  # -C below h
            out = fftconvolve(moved, kernel, mode="same")
            out = np.maximum(out, 0.0)  # FFT round-off
            lost = max(lost, float(law.sum() - out.sum()))
            new.append(out)
        laws = new
        eps.append(discrete_epsilon(laws[0], laws[1], delta))
    return np.array(eps), lost


def worst_case_landscape_epsilons(
    attack: WorstCaseLandscape,
    *,
    noise_multiplier: float,
    steps: int,
    delta: float,
    grid_step: float = 0.01,
) -> ExactEpsilons:
    """Exact eps_t (t = 1..steps) of A_S^{h*} at ``delta``, with its discretisation error.

    Evolves both laws at ``grid_step`` and at ``grid_step / 2``; reports the finer values and
    their difference from the coarser ones as the error.
    """
    if not isinstance(attack, WorstCaseLandscape):
        raise TypeError(f"`attack` must be a WorstCaseLandscape, got {attack!r}.")
    sigma = check_noise_multiplier(noise_multiplier)
    t = check_int("steps", steps, minimum=1)
    d = check_delta(delta)
    dx = check_in_interval("grid_step", grid_step, 0.0, attack.clipping_norm)
    coarse, lost_c = _evolve(attack, sigma, t, dx, d)
    fine, lost_f = _evolve(attack, sigma, t, dx / 2, d)
    return ExactEpsilons(fine, np.abs(fine - coarse), max(lost_c, lost_f))


# ---------------------------------------------------------------------------------------
# Malicious data set: closed-form privacy of the decoded final model.
# ---------------------------------------------------------------------------------------

_ROOT_TOL = 1e-10  # absolute tolerance of the root in epsilon


@dataclass(frozen=True)
class ExactEpsilon:
    """An exact epsilon and a bound on its numerical error.

    Attributes:
        epsilon: the value.
        error: ``|epsilon - true epsilon|`` is at most this (omitted events and root-finding).
        omitted_mass: eta, the total-variation bound of the events left out of the law.
    """

    epsilon: float
    error: float
    omitted_mass: float


@dataclass(frozen=True)
class _MaliciousLaw:
    """Laws of (K, x) with / without the canary (module docs), in units of U."""

    sigma: float
    p_count: NDArray[np.float64]  # P(K = k), with the canary
    q_count: NDArray[np.float64]  # Q(K = k), without
    loss: NDArray[np.float64]  # log P(K = k) / Q(K = k)
    p_last: float  # presence probability at the last step
    omitted: float  # eta

    def _cut(self, level: NDArray[np.float64]) -> NDArray[np.float64]:
        """a with ``{x : l_x(x) >= level} = {x >= a}`` (-inf: every x, +inf: none)."""
        p = self.p_last
        if p == 0.0:  # l_x = 0
            return np.where(level <= 0.0, -np.inf, np.inf)
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            inner = (np.exp(level) - (1.0 - p)) / p
            cut = 0.5 + self.sigma**2 * np.log(inner)
        return np.where(inner > 0.0, cut, -np.inf)

    def _upper(self, a: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
        """(P(x >= a), Q(x >= a))."""
        s, p = self.sigma, self.p_last
        q_tail = ndtr(-a / s)
        return (1.0 - p) * q_tail + p * ndtr((1.0 - a) / s), q_tail

    def tails(self, thresholds: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
        """(P(L >= c), Q(L >= c)) for each c, L = loss(K) + l_x(x)."""
        a = self._cut(thresholds[:, None] - self.loss[None, :])
        pa, qa = self._upper(a)
        return np.clip(pa @ self.p_count, 0.0, 1.0), np.clip(qa @ self.q_count, 0.0, 1.0)

    def hockey_stick(self, eps: float) -> float:
        """max(delta_{P||Q}(eps), delta_{Q||P}(eps))."""
        a = self._cut(eps - self.loss)  # L >= eps
        pa, qa = self._upper(a)
        forward = np.maximum(self.p_count * pa - math.exp(eps) * self.q_count * qa, 0.0).sum()
        b = self._cut(-eps - self.loss)  # L < -eps: x < b
        pb, qb = self._upper(b)
        backward = np.maximum(
            self.q_count * (1.0 - qb) - math.exp(eps) * self.p_count * (1.0 - pb), 0.0
        ).sum()
        return float(max(forward, backward))

    def epsilon(self, delta: float) -> float:
        if delta <= 0.0:
            return math.inf
        if self.hockey_stick(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self.hockey_stick(hi) > delta:
            hi *= 2.0
            if hi > 1e4:
                return math.inf
        return float(brentq(lambda e: self.hockey_stick(e) - delta, 0.0, hi, xtol=_ROOT_TOL))


def _binomial_log_pmf(n: int, log_p: float, log_1mp: float) -> NDArray[np.float64]:
    k = np.arange(n + 1)
    coeff = gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)
    with np.errstate(invalid="ignore"):
        out = coeff + np.where(k > 0, k * log_p, 0.0) + np.where(k < n, (n - k) * log_1mp, 0.0)
    return np.asarray(out, dtype=np.float64)


def _malicious_law(attack: MaliciousDataset, arithmetic: DPSGDArithmetic) -> _MaliciousLaw:
    if not isinstance(attack, MaliciousDataset):
        raise TypeError(f"`attack` must be a MaliciousDataset, got {attack!r}.")
    if not isinstance(arithmetic, DPSGDArithmetic):
        raise TypeError(f"`arithmetic` must be a DPSGDArithmetic, got {arithmetic!r}.")
    if arithmetic.normalisation == "realised":
        raise ValueError("the exact law needs a constant divisor (normalisation 'sum' or 'expected').")
    sigma = arithmetic.noise_multiplier
    if attack.num_repeaters < attack.min_unclipped_repeaters(sigma):
        raise ValueError(
            f"`num_repeaters` must be >= {attack.min_unclipped_repeaters(sigma):.1f} (repeaters "
            f"never clipped), got {attack.num_repeaters}."
        )
    presence = attack.insertion.presence_probabilities(attack.steps)
    informative = presence[:-1] > 0.0
    values = np.unique(presence[:-1][informative])
    if values.size > 1:
        raise ValueError(
            "the exact law needs one presence probability for every step that can hold the "
            f"canary (Poisson or periodic insertion), got {values.tolist()}."
        )
    n = int(informative.sum())
    p = float(values[0]) if n else 0.0
    tau = attack.last_threshold
    # log P(d = 1), log P(d = 0) without / with the canary (flip-free law)
    l0, l0c = float(log_ndtr(-tau / sigma)), float(log_ndtr(tau / sigma))
    l1, l1c = float(log_ndtr((1.0 - tau) / sigma)), float(log_ndtr((tau - 1.0) / sigma))
    with np.errstate(divide="ignore"):
        lp, lpc = math.log(p) if p > 0 else -math.inf, math.log1p(-p) if p < 1 else -math.inf
    m1 = float(np.logaddexp(lp + l1, lpc + l0))
    m0 = float(np.logaddexp(lp + l1c, lpc + l0c))
    log_p, log_q = _binomial_log_pmf(n, m1, m0), _binomial_log_pmf(n, l0, l0c)
    # eta: a record differs from the flip-free one only if one of its T - 2 - j re-thresholds
    # flips it or the last noise mis-decodes it (TV of a product <= sum of TVs), and the
    # repeaters are clipped only if one of the T^2 noise draws exceeds 10 sigma.
    p_down, p_up = attack.flip_probabilities(sigma)
    t = attack.steps
    flips = (t - 1) * (t - 2) / 2 * max(p_down, p_up) + (t - 1) * float(ndtr(-attack.big_value / sigma))
    clipping = 2.0 * t**2 * float(ndtr(-10.0))
    return _MaliciousLaw(
        sigma=sigma,
        p_count=np.exp(log_p),
        q_count=np.exp(log_q),
        loss=log_p - log_q,
        p_last=float(presence[-1]),
        omitted=min(1.0, flips + clipping),
    )


def malicious_dataset_epsilon(
    attack: MaliciousDataset, arithmetic: DPSGDArithmetic, *, delta: float
) -> ExactEpsilon:
    """Exact epsilon at ``delta`` of the final model of the malicious data set (module docs).

    Needs a constant divisor, repeaters that are never clipped (as the analytic simulator)
    and one presence probability for the steps that can hold the canary. The error bound
    covers the root-finding tolerance and the omitted events (mass eta): the true hockey-stick
    divergence is within ``eta (1 + e^eps)`` of the computed one, so the true epsilon lies
    between the epsilons at ``delta +- eta (1 + e^eps)``.
    """
    law = _malicious_law(attack, arithmetic)
    d = check_delta(delta)
    eps = law.epsilon(d)
    error = _ROOT_TOL
    if law.omitted > 0.0 and math.isfinite(eps):
        shift = law.omitted * (1.0 + math.exp(eps + 1.0))
        if shift >= d:
            error = math.inf
        else:
            lo, hi = law.epsilon(d + shift), law.epsilon(d - shift)
            # the shift used e^(eps + 1): self-consistent while hi <= eps + 1
            error = error + max(eps - lo, hi - eps) if hi <= eps + 1.0 else math.inf
    return ExactEpsilon(eps, error, law.omitted)


def malicious_dataset_test_rates(
    attack: MaliciousDataset, arithmetic: DPSGDArithmetic, thresholds: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact (TPR, FPR) of the tests "score >= c" of :meth:`MaliciousDataset.score`.

    The score is the privacy loss of the flip-free law, so these are its Neyman-Pearson
    tests; each rate is within eta (:attr:`ExactEpsilon.omitted_mass`) of the true one.
    """
    law = _malicious_law(attack, arithmetic)
    c = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    if c.ndim != 1 or np.any(np.isnan(c)):
        raise ValueError(f"`thresholds` must be a 1-D array of numbers, got shape {c.shape}.")
    return law.tails(c)
