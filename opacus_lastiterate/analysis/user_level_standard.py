"""The standard (all iterates released) numbers for a user (or a group) of k records
(``docs/privacy_units.md``).

**Poisson** (:class:`UserLevelComposition`). Neighbouring datasets differ by the k records of
one user, added or removed together; each record is in a step's batch independently with
probability q. In step t the user's records add to the clipped gradient sum a vector of norm
at most C_t C, C_t ~ Binomial(k, q_t) the number of them in the batch. The step is dominated by
the mixture-of-Gaussians pair P = sum_c Pr[C_t = c] N(c, sigma_t^2) against Q = N(0, sigma_t^2)
(sensitivities in units of C; Choquette-Choo, Ganesh, Steinke, Thakurta, "Privacy Amplification
for Matrix Mechanisms", arXiv 2310.15526), the accounting Charles et al. use for record-level
sampling with user-level privacy ("Fine-tuning large language models with user-level
differential privacy", arXiv 2407.07737). Steps compose adaptively. The privacy loss
distribution of each distinct (sigma, q) is dp_accounting's ``from_mixture_gaussian_mechanism``
(pessimistic connect-the-dots at ``value_discretization_interval``, both the remove and the add
direction), self-composed over its steps and composed over segments: what dp_accounting's
``PLDAccountant`` composes for ``MixtureOfGaussiansDpEvent`` s. An upper bound; k = 1 is the
Poisson-subsampled Gaussian of :class:`~.baselines.composition.StandardComposition`.

**Epoch schemes** (:class:`UserLevelNoAmplificationBound`). In one epoch each record is used
at most once, so the user's k records add vectors v_t to the epoch's steps with
sum_t ``||v_t||`` <= k C. Stacking the epoch's noisy sums, the change has L2 norm
sqrt(sum_t ``||v_t||^2``) <= sum_t ``||v_t||`` <= k C: the epoch is a Gaussian mechanism of
sensitivity k at its smallest noise multiplier, mu_e = k / min sigma, wherever the records
sit (a random placement is no worse than the worst fixed one). Epochs compose:
mu = k sqrt(sum_e (1 / min sigma_e)^2), k times the record-level
:class:`~.sampling_standard.NoAmplificationBound` (the same as group privacy of mu-GDP, "Gaussian
Differential Privacy", arXiv 1905.02383). Neighbours: the user's records zeroed out (same N,
same batches) for shuffled and deterministic batches; added or removed for balls-in-bins (the
other records keep their steps). Valid, loose: no amplification is credited.

**Group privacy of a record-level bound** (:class:`GroupPrivacyConversion`): from an
(eps, delta) guarantee for one record, a group of k records (a chain of k neighbouring
datasets) gets (k eps, delta (e^{k eps} - 1) / (e^eps - 1)). Valid for any record-level upper
bound and any relation that chains; much looser than the direct computation above; printed
beside it for comparison.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import stats

from opacus_lastiterate.analysis._validation import check_int, check_positive
from opacus_lastiterate.analysis.privacy_model import PrivacyModel, poisson_run
from opacus_lastiterate.analysis.run import RunLike
from opacus_lastiterate.analysis.sampling import BallsInBins, UnknownSampling
from opacus_lastiterate.analysis.sampling_standard import NoAmplificationBound

__all__ = [
    "GroupPrivacyConversion",
    "UserLevelComposition",
    "UserLevelNoAmplificationBound",
]


@functools.lru_cache(maxsize=64)
def mixture_of_gaussians_step_pld(
    noise_multiplier: float, sample_rate: float, records: int, interval: float
) -> Any:
    """dp_accounting PLD of one step for a unit of ``records`` Poisson-sampled records:
    sensitivity c with probability Binomial(records, sample_rate)(c) (module docstring).

    Built as dp_accounting's ``from_mixture_gaussian_mechanism`` builds it (its
    ``MixtureGaussianPrivacyLoss`` for the grid bounds and the normal tails, pessimistic
    connect-the-dots on the grid ``i * interval``, both directions), except that the inverse
    privacy loss at the grid points is found by vectorised Newton iterations (the loss is a
    log-sum-exp of affine functions, so Newton from the right converges monotonically) instead
    of dp_accounting's bisection to 1e-6, which takes minutes for k >= 16 at 1e-4."""
    from dp_accounting.pld import pld_pmf, privacy_loss_mechanism
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    counts = np.arange(records + 1, dtype=float)
    probs = stats.binom.pmf(counts, records, sample_rate)
    keep = probs > 0  # a zero-probability component changes nothing
    counts, probs = counts[keep], probs[keep]

    def pmf(adjacency: Any) -> Any:
        loss = privacy_loss_mechanism.MixtureGaussianPrivacyLoss(
            noise_multiplier, counts.tolist(), probs.tolist(), adjacency_type=adjacency
        )
        bounds = loss.connect_dots_bounds()
        low = math.floor(bounds.epsilon_lower / interval)
        high = math.ceil(bounds.epsilon_upper / interval)
        epsilons = np.arange(low, high + 1) * interval
        remove = adjacency is privacy_loss_mechanism.AdjacencyType.REMOVE
        deltas = _mixture_deltas(loss, epsilons, counts, probs, noise_multiplier, remove)
        return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(interval, low, high, deltas)

    return PrivacyLossDistribution(
        pmf(privacy_loss_mechanism.AdjacencyType.REMOVE),
        pmf(privacy_loss_mechanism.AdjacencyType.ADD),
    )


def _inverse_loss(
    targets: np.ndarray, counts: np.ndarray, probs: np.ndarray, sigma: float
) -> np.ndarray:
    """y with h(y) = t for each target t > log Pr[c = 0], where
    h(y) = log sum_c p_c exp((2 y c - c^2) / (2 sigma^2)) is convex and increasing: Newton
    from a point right of the root (one component's bound) decreases monotonically to it."""
    positive = counts > 0
    c, lp = counts[positive], np.log(probs[positive])
    var = sigma * sigma
    # h(y) >= lp_i + (2 y c_i - c_i^2) / (2 var): y_i(t) is right of the root for each i.
    y = np.min((targets[:, None] - lp[None, :]) * var / c[None, :] + 0.5 * c[None, :], axis=1)
    slope = counts / var
    offset = np.log(probs) - counts * counts / (2 * var)
    for _ in range(200):
        z = offset[None, :] + slope[None, :] * y[:, None]
        top = z.max(axis=1, keepdims=True)
        e = np.exp(z - top)
        total = e.sum(axis=1)
        h = top[:, 0] + np.log(total)
        dh = (e * slope[None, :]).sum(axis=1) / total
        step = (h - targets) / dh
        y_new = y - np.maximum(step, 0.0)  # monotone from the right
        if np.all(np.abs(y_new - y) <= 1e-13 * (1.0 + np.abs(y))):
            return y_new
        y = y_new
    return y


def _mixture_deltas(
    loss: Any,
    epsilons: np.ndarray,
    counts: np.ndarray,
    probs: np.ndarray,
    sigma: float,
    remove: bool,
) -> np.ndarray:
    """delta(eps) of one direction of the mixture pair at each grid epsilon (dp_accounting's
    ``MixtureGaussianPrivacyLoss.get_delta_for_epsilon`` with exact cutoffs)."""
    deltas = np.zeros_like(epsilons)
    p0 = float(probs[counts == 0].sum())
    log_p0 = math.log(p0) if p0 > 0 else -math.inf
    if remove:  # loss at x is h(-x): the set {loss >= eps} is x <= -h^{-1}(eps)
        inside = epsilons > log_p0
        deltas[~inside] = -np.expm1(epsilons[~inside])
        cutoffs = -_inverse_loss(epsilons[inside], counts, probs, sigma)
    else:  # loss at x is -h(x): the set {loss >= eps} is x <= h^{-1}(-eps)
        inside = epsilons < -log_p0
        cutoffs = _inverse_loss(-epsilons[inside], counts, probs, sigma)
    eps = epsilons[inside]
    deltas[inside] = loss.mu_upper_cdf(cutoffs) - np.exp(eps + loss.mu_lower_log_cdf(cutoffs))
    deltas = np.clip(deltas, 0.0, 1.0)
    return np.maximum.accumulate(deltas[::-1])[::-1]  # non-increasing, as dp_accounting makes it


class UserLevelComposition(PrivacyModel):
    """Every intermediate model released, for the run's unit of k Poisson-sampled records:
    mixture-of-Gaussians PLDs composed with dp_accounting (module docstring; add/remove of
    the unit's records; a pessimistic upper bound).

    Args:
        run: a run with Poisson (or unspecified) sampling; its ``unit`` gives k.
        value_discretization_interval: dp_accounting's PLD grid step (nats), > 0.
    """

    kind = "upper_bound"
    units = True

    def __init__(self, run: RunLike, *, value_discretization_interval: float = 1e-4) -> None:
        self.run = poisson_run(run, model="UserLevelComposition", name="standard")
        self.interval = check_positive(
            "value_discretization_interval", value_discretization_interval
        )
        self.records = self.run.unit.max_records
        self._pld: Any = None

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which unit."""
        return (
            f"standard composition (all iterates released); {self.run.unit.label()}; each "
            "record Poisson-sampled: dp_accounting mixture-of-Gaussians PLD, upper bound "
            "(add/remove of the unit's records)"
        )

    def _composed(self) -> Any:
        if self._pld is None:
            composed = None
            for s in self.run.segments:
                step = mixture_of_gaussians_step_pld(
                    s.noise_multiplier, s.sample_rate, self.records, self.interval
                )
                part = step.self_compose(s.steps) if s.steps > 1 else step
                composed = part if composed is None else composed.compose(part)
            self._pld = composed
        return self._pld

    def _epsilon(self, delta: float) -> float:
        return float(self._composed().get_epsilon_for_delta(delta))

    def _delta(self, epsilon: float) -> float:
        return float(self._composed().get_delta_for_epsilon(epsilon))

    def __repr__(self) -> str:
        return f"UserLevelComposition(records={self.records}, steps={self.run.num_steps})"


class UserLevelNoAmplificationBound(NoAmplificationBound):
    """Every intermediate model released, for the run's unit of k records and an epoch scheme:
    mu = k times the record-level no-amplification mu (module docstring; zero-out neighbours
    for fixed-size batches, add/remove for balls-in-bins; an upper bound).

    Args:
        run: a run whose ``sampling`` is an epoch scheme (or an unknown sampler assuming one).
        value_discretization_interval, orders: accepted so that the registry's ``"standard"``
            and ``"standard_rdp"`` parameters pass; the bound is in closed form and uses
            neither.
    """

    units = True

    def __init__(
        self,
        run: RunLike,
        *,
        value_discretization_interval: float | None = None,
        orders: object = None,
    ) -> None:
        super().__init__(run)
        self.records = self.run.unit.max_records
        self.mu *= self.records

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which unit, scheme and neighbours."""
        neighbours = "add/remove" if isinstance(self.scheme, BallsInBins) else "zero-out"
        assumes = "assumes " if isinstance(self.run.sampling, UnknownSampling) else ""
        return (
            f"standard composition (all iterates released); {self.run.unit.label()}; "
            f"{assumes}{self.run.sampling.describe()}: upper bound without amplification "  # type: ignore[union-attr]
            f"({neighbours} of the unit's records; one Gaussian mechanism of sensitivity "
            f"{self.records} per epoch)"
        )

    def __repr__(self) -> str:
        return f"UserLevelNoAmplificationBound(records={self.records}, mu={self.mu:.6g})"


def _log_expm1(x: float) -> float:
    """log(e^x - 1) for x > 0, without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 30.0 else math.log(math.expm1(x))


class GroupPrivacyConversion(PrivacyModel):
    """Group privacy of size k from a record-level model (module docstring):
    delta_k(eps) = delta_1(eps / k) (e^eps - 1) / (e^{eps / k} - 1).

    Args:
        model: a record-level :class:`~.privacy_model.PrivacyModel` (its number is converted;
            a valid bound only when ``model`` is one).
        size: k, the group size, an integer >= 1.
    """

    def __init__(self, model: PrivacyModel, size: int) -> None:
        if not isinstance(model, PrivacyModel):
            raise TypeError(f"`model` must be a PrivacyModel, got {model!r}.")
        self.size = check_int("size", size, minimum=1)
        self.model = model
        self.run = model.run
        self.kind = model.kind  # type: ignore[misc]

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is."""
        return f"group privacy of {self.size} records from: {self.model.label}"

    def _delta(self, epsilon: float) -> float:
        k = self.size
        if k == 1:
            return self.model.delta(epsilon)
        base = self.model.delta(epsilon / k)
        if base <= 0.0:
            return 0.0
        if epsilon == 0.0:
            log_factor = math.log(k)
        else:  # log((e^eps - 1) / (e^{eps / k} - 1)), without overflow
            log_factor = _log_expm1(epsilon) - _log_expm1(epsilon / k)
        return math.exp(min(0.0, math.log(base) + log_factor))

    def _epsilon(self, delta: float) -> float:
        """The smallest epsilon (to 1e-6 relative, rounded up) whose converted delta is at
        most ``delta``; every returned value satisfies the conversion's inequality."""
        if self.size == 1:
            return self.model.epsilon(delta)
        if self._delta(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self._delta(hi) > delta:
            hi *= 2.0
            if hi > 1e6:
                return math.inf
        lo = hi / 2.0 if hi > 1.0 else 0.0
        while hi - lo > 1e-6 * hi:
            mid = 0.5 * (lo + hi)
            if self._delta(mid) <= delta:
                hi = mid
            else:
                lo = mid
        return hi

    def __repr__(self) -> str:
        return f"GroupPrivacyConversion(size={self.size}, model={self.model!r})"
