"""One step of the Poisson-subsampled Gaussian mechanism as a dp_accounting PLD, built with
vectorised numpy (``docs/last_iterate.md``, "Baselines").

The result is the PLD that ``dp_accounting``'s ``from_gaussian_mechanism(sigma,
sampling_prob=q, use_connect_dots=True)`` returns (add/remove neighbours, pessimistic
connect-the-dots discretisation on the grid ``k * interval``): the grid, the tail bounds and
the connect-the-dots PMF come from dp_accounting itself, only the hockey-stick divergence at
the grid points is evaluated here, as one array expression instead of one Python call per
grid point (about 57,000 points per direction at ``interval = 1e-4``). With the privacy loss
L(x) of the mechanism (noise N(0, sigma^2), sensitivity 1) and the largest x* with
L(x*) >= eps,

    remove:  x* = -1/2 - sigma^2 log(1 + (e^eps - 1) / q)     for eps > log(1 - q)
    add:     x* =  1/2 + sigma^2 log(1 + (e^-eps - 1) / q)    for eps < -log(1 - q)
    delta(eps) = P_upper(X <= x*) - e^eps P_lower(X <= x*)

(outside those ranges delta is 1 - e^eps for remove and 0 for add). The two routes agree to
floating-point rounding (``tests/analysis/baselines/test_subsampled_gaussian_pld.py``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf, privacy_loss_mechanism
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import NDArray
from scipy import special

__all__ = [
    "subsampled_gaussian_pld",
]

_ADD = privacy_loss_mechanism.AdjacencyType.ADD
_REMOVE = privacy_loss_mechanism.AdjacencyType.REMOVE
_ISCLOSE = 1e-9  # math.isclose's default relative tolerance, as dp_accounting uses it


@functools.lru_cache(maxsize=64)
def subsampled_gaussian_pld(
    noise_multiplier: float, sample_rate: float, value_discretization_interval: float
) -> PrivacyLossDistribution:
    """PLD of one step with noise multiplier ``sigma > 0`` and Poisson rate ``q`` in (0, 1].

    Cached: a dp_accounting PLD is never modified by ``compose``/``self_compose``."""
    def pmf(adjacency: privacy_loss_mechanism.AdjacencyType) -> pld_pmf.PLDPmf:
        low, deltas = _grid_deltas(
            noise_multiplier, sample_rate, value_discretization_interval, adjacency
        )
        return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
            value_discretization_interval, low, low + deltas.size - 1, deltas
        )

    remove = pmf(_REMOVE)
    if sample_rate == 1.0:
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(remove, pmf(_ADD))


def loss_range(noise_multiplier: float, sample_rate: float) -> float:
    """The widest span of privacy losses (nats) that the connect-the-dots PLD of one step
    covers, over both directions: its grid has about this over the interval points."""
    spans = []
    for adjacency in (_REMOVE, _ADD):
        bounds = privacy_loss_mechanism.GaussianPrivacyLoss(
            noise_multiplier, sampling_prob=sample_rate, adjacency_type=adjacency
        ).connect_dots_bounds()
        spans.append(bounds.epsilon_upper - bounds.epsilon_lower)
    return max(spans)


@dataclass(frozen=True)
class LossPmf:
    """A discretised privacy-loss distribution as arrays: mass ``probs[i]`` at loss
    ``(lower + i) * interval`` and ``infinity_mass`` at +inf (what a dp_accounting
    ``DensePLDPmf`` holds)."""

    lower: int
    probs: NDArray[np.float64]
    infinity_mass: float


def subsampled_gaussian_pmfs(
    noise_multiplier: float, sample_rate: float, value_discretization_interval: float
) -> tuple[LossPmf, LossPmf]:
    """The (remove, add) PMFs of :func:`subsampled_gaussian_pld`, as arrays: the same grid,
    deltas and pessimistic connect-the-dots masses (the formula of dp_accounting's
    ``create_pmf_pessimistic_connect_dots_fixed_gap``, without its dictionary round trip).
    With ``q = 1`` both are the remove PMF (dp_accounting's symmetric PLD)."""
    d = value_discretization_interval

    def pmf(adjacency: privacy_loss_mechanism.AdjacencyType) -> LossPmf:
        low, deltas = _grid_deltas(noise_multiplier, sample_rate, d, adjacency)
        if deltas.size == 1:
            return LossPmf(low, np.array([1.0 - deltas[0]]), float(deltas[0]))
        deltas = np.minimum.accumulate(deltas)
        diffs = np.diff(deltas)
        probs = np.zeros_like(deltas)
        probs[0] = 1 - deltas[0] + diffs[0] / math.expm1(d)
        probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(d)) / math.expm1(d)
        probs[-1] = diffs[-1] / math.expm1(-d)
        return LossPmf(low, np.maximum(0.0, probs), float(deltas[-1]))

    remove = pmf(_REMOVE)
    return remove, (remove if sample_rate == 1.0 else pmf(_ADD))


def _grid_deltas(
    sigma: float, q: float, interval: float, adjacency: privacy_loss_mechanism.AdjacencyType
) -> tuple[int, NDArray[np.float64]]:
    """(lowest grid index, delta at each grid point) of one direction: dp_accounting's
    connect-the-dots grid for the mechanism."""
    loss = privacy_loss_mechanism.GaussianPrivacyLoss(
        sigma, sampling_prob=q, adjacency_type=adjacency
    )
    bounds = loss.connect_dots_bounds()
    low = math.floor(bounds.epsilon_lower / interval)
    high = math.ceil(bounds.epsilon_upper / interval)
    epsilons = np.arange(low, high + 1) * interval
    return low, _hockey_stick(epsilons, sigma, q, adjacency)


def _hockey_stick(
    epsilons: NDArray[np.float64], sigma: float, q: float,
    adjacency: privacy_loss_mechanism.AdjacencyType,
) -> NDArray[np.float64]:
    """delta(eps) of the subsampled Gaussian (``sigma``, ``q``, ``adjacency``) at every
    ``epsilons`` (the formula in the module docstring)."""
    deltas = np.zeros_like(epsilons)
    if q == 1.0:
        inside = np.ones(epsilons.shape, dtype=bool)
        unsampled = epsilons
    else:
        edge = math.log1p(-q)  # log(1 - q)
        if adjacency is _REMOVE:
            inside = epsilons > edge
            deltas[~inside] = -np.expm1(epsilons[~inside])
            signed = epsilons[inside]
        else:
            inside = epsilons < -edge
            signed = -epsilons[inside]
        # log(e^s / q + 1 - 1/q) = d + log1p(-e^{log(1/q - 1) - d}) with d = s + log(1/q); it is
        # -inf at s = log(1 - q), which dp_accounting also takes for s within math.isclose.
        d = signed + np.log(1.0 / q)  # the operations of dp_accounting's scalar route
        with np.errstate(divide="ignore"):
            unsampled = d + np.log1p(-np.exp(np.log(-(1.0 - 1.0 / q)) - d))
        at_edge = np.abs(signed - edge) <= _ISCLOSE * np.maximum(np.abs(signed), abs(edge))
        unsampled[at_edge] = -np.inf
        if adjacency is _ADD:
            unsampled = -unsampled
    cutoff = -0.5 - unsampled * sigma**2
    if adjacency is _ADD:
        cutoff = cutoff + 1.0
    eps = epsilons[inside]
    deltas[inside] = _upper_cdf(cutoff, sigma, q, adjacency) - np.exp(
        eps + _lower_log_cdf(cutoff, sigma, q, adjacency)
    )
    return np.clip(deltas, 0.0, 1.0)


def _upper_cdf(x: NDArray[np.float64], sigma: float, q: float,
               adjacency: privacy_loss_mechanism.AdjacencyType) -> NDArray[np.float64]:
    """``GaussianPrivacyLoss.mu_upper_cdf`` (sensitivity 1) with the operations of
    ``scipy.stats.norm(scale=sigma).cdf`` (``ndtr`` of x / sigma), without its per-call
    argument handling."""
    if adjacency is _ADD:
        return special.ndtr(x / sigma)
    if q == 1.0:
        return special.ndtr((x + 1) / sigma)
    return (1 - q) * special.ndtr(x / sigma) + q * special.ndtr((x + 1) / sigma)


def _lower_log_cdf(x: NDArray[np.float64], sigma: float, q: float,
                   adjacency: privacy_loss_mechanism.AdjacencyType) -> NDArray[np.float64]:
    """``GaussianPrivacyLoss.mu_lower_log_cdf`` (sensitivity 1) with the operations of
    ``scipy.stats.norm(scale=sigma).logcdf`` (``log_ndtr`` of x / sigma)."""
    if adjacency is _REMOVE:
        return special.log_ndtr(x / sigma)
    if q == 1.0:
        return special.log_ndtr((x - 1) / sigma)
    return np.logaddexp(
        np.log1p(-q) + special.log_ndtr(x / sigma),
        np.log(q) + special.log_ndtr((x - 1) / sigma),
    )
