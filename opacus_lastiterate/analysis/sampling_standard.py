"""The standard (all iterates released) numbers per sampling scheme (``docs/samplers.md``).

**Adjacency.** Poisson numbers use add/remove neighbours. With fixed-size batches
(shuffled, deterministic) adding or removing a record moves other records between batches
(under a fixed order every later batch changes by one record in and one out) and can change
the number of batches, so no per-epoch bound of the form below holds for add/remove. The
numbers for fixed-size batches are for *zero-out* neighbours: one record replaced by one whose
clipped gradient is zero at every step (same dataset size, same batches), under which a step's
clipped sum changes by at most C, as for add/remove under Poisson. Substitution by an
arbitrary record changes it by up to 2C: mu doubles. Balls-in-bins assigns each record
independently, so add/remove neighbours keep the other records' steps and the same bound
holds for add/remove.

:class:`NoAmplificationBound` (an upper bound). Each epoch uses the record in at most one step,
so an epoch's releases are, for that record, one Gaussian mechanism with sensitivity 1 and the
noise of the step that used it; a random position is at most as revealing as the worst fixed
one (joint convexity of the hockey-stick divergence), so epoch e is at most mu_e-GDP with
mu_e = 1 / min sigma over its steps, and epochs compose adaptively to
mu = sqrt(sum_e mu_e^2) (Dong, Roth and Su, "Gaussian Differential Privacy", arXiv 1905.02383).
With one sigma and E epochs (a partial epoch counts as one): mu = sqrt(E) / sigma, the
deterministic-order accountant of Chua et al. No amplification by shuffling or by random
allocation is credited, so for shuffled and balls-in-bins batches this is valid but loose.

:class:`PoissonAssumed`: the Poisson PLD value of the same history, labelled as an assumption.

:func:`shuffle_lower_bound_delta` / :class:`ShuffleLowerBound`: a lower bound for shuffled
batches after Chua, Ghazi, Kamath, Kumar, Manurangsi, Sinha, Zhang, "How Private are DP-SGD
Implementations?" (arXiv 2403.17673, one epoch) and "Scalable DP-SGD: Shuffling vs. Poisson
Subsampling" (arXiv 2411.04205, several epochs). In one epoch of K steps the other records'
gradients are set to -1 along the canary's direction and the canary's to +1, against a
zero-gradient record (zero-out neighbours); after shifting, the epoch's releases are
P = (1/K) sum_t N(2 e_t, sigma^2 I_K) against Q = (1/K) sum_t N(e_t, sigma^2 I_K). We keep
only the largest coordinate M = max_t y_t of each epoch, whose distribution functions are
F_P(m) = Phi((m - 2)/sigma) Phi(m/sigma)^(K-1) and F_Q(m) = Phi((m - 1)/sigma) Phi(m/sigma)^(K-1),
and coarsen it further to which of a partition of the line into intervals of width
:data:`SHUFFLE_SLICE_WIDTH` times sigma^2 it falls in (the two unbounded ends included, so no
mass is dropped). Over E reshuffled epochs the E interval indices are independent, so the run's
releases, post-processed, are the E-fold product of this discrete pair; its hockey-stick
divergence (both orders) is a lower bound on the true delta of the pair above, and so of the
shuffled run. The product is composed with dp_accounting from the discrete pair, with privacy
losses rounded *down* to multiples of ``value_discretization_interval`` (an optimistic PLD,
which only lowers delta), so delta is a lower bound and epsilon(delta) too; the rounding costs
at most E times the interval in epsilon. For K = 1 the pair is Gaussian with mu = sqrt(E)/sigma
and the bound is that value up to the rounding.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_int,
    check_noise_multiplier,
    check_positive,
)
from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
    gaussian_delta,
    gaussian_epsilon,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    ShuffledBatches,
    UnknownSampling,
    effective_sampling,
)
from opacus_lastiterate.analysis.sampling_heuristic import epoch_layout, epoch_scheme_of

__all__ = [
    "NoAmplificationBound",
    "PoissonAssumed",
    "ShuffleLowerBound",
    "shuffle_lower_bound_delta",
    "shuffle_lower_bound_epsilon",
]

POISSON_ASSUMED_LABEL = "assumes Poisson sampling: not a guarantee for this run"


def no_amplification_mu(run: RunLike) -> float:
    """mu of :class:`NoAmplificationBound` (module docstring) for a run with an epoch scheme."""
    layout = epoch_layout(run)
    mus = []
    for e in np.unique(layout.epoch):
        smallest = float(layout.sigmas[layout.epoch == e].min())
        mus.append(math.inf if smallest == 0 else 1.0 / smallest)
    return math.sqrt(float(np.sum(np.square(mus))))


def _prefix(run: DPSGDRun) -> str:
    return "assumes " if isinstance(run.sampling, UnknownSampling) else ""


class NoAmplificationBound(PrivacyModel):
    """Upper bound for all iterates: epochs composed as Gaussian mechanisms, no amplification
    (module docstring; zero-out neighbours for fixed-size batches, add/remove for
    balls-in-bins)."""

    kind = "upper_bound"

    def __init__(
        self,
        run: RunLike,
        *,
        value_discretization_interval: float | None = None,
        orders: object = None,
    ) -> None:
        """``value_discretization_interval`` and ``orders`` are accepted so that the registry's
        ``"standard"`` and ``"standard_rdp"`` take their usual parameters; the bound is in
        closed form and uses neither."""
        self.run = as_run(run)
        self.scheme = epoch_scheme_of(self.run)
        self.mu = no_amplification_mu(self.run) if self.run.num_steps else 0.0

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which scheme and neighbours."""
        neighbours = "add/remove" if isinstance(self.scheme, BallsInBins) else "zero-out"
        return (
            f"standard composition (all iterates released) for {_prefix(self.run)}"
            f"{self.run.sampling.describe() if self.run.sampling else ''}: upper bound without "
            f"amplification ({neighbours} neighbours; one Gaussian mechanism per epoch)"
        )

    def _epsilon(self, delta: float) -> float:
        return gaussian_epsilon(mu=self.mu, delta=delta)

    def _delta(self, epsilon: float) -> float:
        return gaussian_delta(mu=self.mu, epsilon=epsilon)


class PoissonAssumed(PrivacyModel):
    """The Poisson standard number (dp_accounting PLD) of the run's history, for a run that
    did not sample Poisson batches: what Opacus reports; not a guarantee for this run."""

    kind = "model"
    label = POISSON_ASSUMED_LABEL

    def __init__(self, run: RunLike, *, value_discretization_interval: float = 1e-4) -> None:
        self.run = as_run(run)
        poisson = DPSGDRun._trusted(self.run.segments, self.run.weights, self.run.normalisation)
        self._model = StandardComposition(
            poisson, value_discretization_interval=value_discretization_interval
        )

    def _epsilon(self, delta: float) -> float:
        return self._model.epsilon(delta)

    def _delta(self, epsilon: float) -> float:
        return self._model.delta(epsilon)


# -- the shuffling lower bound --------------------------------------------------------------------


SHUFFLE_SLICE_WIDTH = 2e-3
"""Width of the intervals the largest coordinate is coarsened to, in units of sigma^2 (the
privacy loss of the max statistic grows with slope at most about 1/sigma^2)."""

SHUFFLE_VALUE_DISCRETIZATION = 1e-4
"""Default grid of the optimistic PLD of the shuffling lower bound (epsilon is understated by
at most the number of epochs times this)."""

_LOG_TAIL = 50.0  # the outer cut points leave about exp(-50) of mass in each unbounded end


def _log_max_cdf(m: np.ndarray, sigma: float, k: int, mean: float) -> np.ndarray:
    """log Pr[max_t y_t <= m] under (1/K) sum_t N(mean e_t, sigma^2 I_K)."""
    return special.log_ndtr((m - mean) / sigma) + (k - 1) * special.log_ndtr(m / sigma)


def _slice_log_masses(cuts: np.ndarray, sigma: float, k: int, mean: float) -> np.ndarray:
    """log masses of (-inf, c_0], (c_0, c_1], ..., (c_n, inf) under the max statistic, each
    from the distribution function or from the survival function, whichever is small."""
    log_f = _log_max_cdf(cuts, sigma, k, mean)
    with np.errstate(divide="ignore"):
        log_s = np.log(-np.expm1(log_f))
        below = log_f[1:] + np.log(-np.expm1(log_f[:-1] - log_f[1:]))
        above = log_s[:-1] + np.log(-np.expm1(log_s[1:] - log_s[:-1]))
    inner = np.where(log_f[1:] < math.log(0.5), below, above)
    return np.concatenate([log_f[:1], inner, log_s[-1:]])


def _max_statistic_cuts(sigma: float, k: int) -> np.ndarray:
    low = sigma * float(special.ndtri(math.exp(-_LOG_TAIL / k)))
    high = 2.0 + 10.0 * sigma
    return np.arange(low, high, SHUFFLE_SLICE_WIDTH * sigma * sigma)


def shuffle_lower_bound_pld(
    *,
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int,
    value_discretization_interval: float = SHUFFLE_VALUE_DISCRETIZATION,
) -> Any:
    """The optimistic dp_accounting PLD of ``epochs`` epochs of the coarsened max statistic
    (module docstring): its deltas and epsilons are lower bounds for shuffled batches."""
    sigma = check_noise_multiplier(noise_multiplier)
    k = check_int("steps_per_epoch", steps_per_epoch, minimum=1)
    e = check_int("epochs", epochs, minimum=1)
    h = check_positive("value_discretization_interval", value_discretization_interval)
    return _max_statistic_pld(sigma, k, e, h)


@functools.lru_cache(maxsize=32)
def _max_statistic_pld(sigma: float, k: int, epochs: int, h: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    cuts = _max_statistic_cuts(sigma, k)
    log_p = _slice_log_masses(cuts, sigma, k, 2.0)
    log_q = _slice_log_masses(cuts, sigma, k, 1.0)
    upper = {i: float(v) for i, v in enumerate(log_p) if np.isfinite(v)}
    lower = {i: float(v) for i, v in enumerate(log_q) if np.isfinite(v)}
    one = pld_lib.from_two_probability_mass_functions(
        lower, upper, pessimistic_estimate=False, value_discretization_interval=h,
        symmetric=False,
    )
    return one if epochs == 1 else one.self_compose(epochs)


def shuffle_lower_bound_delta(
    epsilon: float,
    *,
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int,
    value_discretization_interval: float = SHUFFLE_VALUE_DISCRETIZATION,
) -> float:
    """A lower bound on delta(epsilon) of DP-SGD with shuffled batches (all iterates released,
    zero-out neighbours): module docstring. ``epochs`` whole epochs of ``steps_per_epoch``."""
    eps = check_epsilon(epsilon)
    pld = shuffle_lower_bound_pld(
        noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
        value_discretization_interval=value_discretization_interval,
    )
    return max(0.0, float(pld.get_delta_for_epsilon(eps)))


def shuffle_lower_bound_epsilon(
    delta: float,
    *,
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int,
    value_discretization_interval: float = SHUFFLE_VALUE_DISCRETIZATION,
) -> float:
    """A lower bound on epsilon(delta) for shuffled batches: epsilon of the optimistic PLD of
    :func:`shuffle_lower_bound_pld` at ``delta`` (0 when its delta never exceeds ``delta``)."""
    d = check_delta(delta)
    pld = shuffle_lower_bound_pld(
        noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs,
        value_discretization_interval=value_discretization_interval,
    )
    return max(0.0, float(pld.get_epsilon_for_delta(d)))


class ShuffleLowerBound(PrivacyModel):
    """:func:`shuffle_lower_bound_epsilon` for a shuffled run with one noise multiplier (the
    whole epochs of the run; a partial epoch is left out, which keeps it a lower bound)."""

    kind = "lower_bound"

    def __init__(self, run: RunLike) -> None:
        self.run = as_run(run)
        scheme = effective_sampling(self.run.sampling)
        if not isinstance(scheme, ShuffledBatches):
            raise ValueError(f"`run.sampling` must be ShuffledBatches, got {self.run.sampling!r}.")
        sigmas = {s.noise_multiplier for s in self.run.segments}
        if len(sigmas) > 1:
            raise ValueError("`run` must have one noise multiplier for the shuffling lower bound.")
        self.steps_per_epoch = scheme.steps_per_epoch
        skipped = (-scheme.first_step_in_epoch) % self.steps_per_epoch
        self.epochs = max(0, self.run.num_steps - skipped) // self.steps_per_epoch
        self.sigma = sigmas.pop() if sigmas else 1.0

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is."""
        return (
            "lower bound for shuffled batches (all iterates; zero-out neighbours; largest "
            "coordinate per epoch composed over epochs, Chua et al., arXiv 2403.17673 and "
            "2411.04205)"
        )

    def _epsilon(self, delta: float) -> float:
        if self.epochs == 0:
            return 0.0
        return shuffle_lower_bound_epsilon(
            delta, noise_multiplier=self.sigma, steps_per_epoch=self.steps_per_epoch,
            epochs=self.epochs,
        )

    def _delta(self, epsilon: float) -> float:
        if self.epochs == 0:
            return 0.0
        return shuffle_lower_bound_delta(
            epsilon, noise_multiplier=self.sigma, steps_per_epoch=self.steps_per_epoch,
            epochs=self.epochs,
        )
