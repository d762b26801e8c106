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
Implementations?" (arXiv 2403.17673): in one epoch of K steps, the pair of mixtures
P = (1/K) sum_t N(2 e_t, sigma^2 I_K) and Q = (1/K) sum_t N(e_t, sigma^2 I_K) (the other
records' gradients at -1 along the canary's direction, the canary at +1 against a zero-gradient
record: zero-out neighbours) is tested with the set {max_t y_t > c}. Over E reshuffled epochs we
count the epochs whose test fires: Binomial(E, a_c) against Binomial(E, b_c), a post-processing
of the released outputs, so its hockey-stick divergence, maximised over c, is a lower bound on
the true delta (for E = 1 it is their single-epoch bound).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from opacus_lastiterate.analysis._bisection import monotone_boundary
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_int,
    check_noise_multiplier,
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
    "POISSON_ASSUMED_LABEL",
    "NoAmplificationBound",
    "PoissonAssumed",
    "ShuffleLowerBound",
    "no_amplification_mu",
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


def _fire_probabilities(sigma: float, k: int, caps: np.ndarray, mean: float) -> np.ndarray:
    """Pr[max_t y_t > c] under (1/K) sum_t N(mean e_t, sigma^2 I_K)."""
    log_in = special.log_ndtr((caps - mean) / sigma) + (k - 1) * special.log_ndtr(caps / sigma)
    return -np.expm1(log_in)


def shuffle_lower_bound_delta(
    epsilon: float, *, noise_multiplier: float, steps_per_epoch: int, epochs: int
) -> float:
    """A lower bound on delta(epsilon) of DP-SGD with shuffled batches (all iterates released,
    zero-out neighbours): module docstring. ``epochs`` whole epochs of ``steps_per_epoch``."""
    eps = check_epsilon(epsilon)
    sigma = check_noise_multiplier(noise_multiplier)
    k = check_int("steps_per_epoch", steps_per_epoch, minimum=1)
    e = check_int("epochs", epochs, minimum=1)
    caps = np.linspace(-2.0 * sigma, 2.0 + sigma * (3.0 + math.sqrt(2 * math.log(k + 1)) * 2), 4001)
    a = _fire_probabilities(sigma, k, caps, 2.0)
    b = _fire_probabilities(sigma, k, caps, 1.0)
    counts = np.arange(e + 1)[:, None]
    with np.errstate(divide="ignore"):
        log_p = stats.binom.logpmf(counts, e, a[None, :])
        log_q = stats.binom.logpmf(counts, e, b[None, :])
    h_pq = np.clip(np.exp(log_p) - np.exp(eps + log_q), 0.0, None).sum(axis=0)
    h_qp = np.clip(np.exp(log_q) - np.exp(eps + log_p), 0.0, None).sum(axis=0)
    return float(max(h_pq.max(), h_qp.max(), 0.0))


def shuffle_lower_bound_epsilon(
    delta: float, *, noise_multiplier: float, steps_per_epoch: int, epochs: int
) -> float:
    """A lower bound on epsilon(delta): the largest epsilon whose lower-bound delta still
    exceeds ``delta`` (bisection to 1e-6 relative, rounded down)."""
    d = check_delta(delta)

    def f(x: float) -> float:
        return shuffle_lower_bound_delta(
            x, noise_multiplier=noise_multiplier, steps_per_epoch=steps_per_epoch, epochs=epochs
        )

    def above(x: float) -> bool:
        return f(x) > d

    if not above(0.0):
        return 0.0
    lo, hi = monotone_boundary(above, rtol=1e-6, cap=1e4)
    return lo if math.isfinite(hi) else math.inf


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
            "lower bound for shuffled batches (all iterates; zero-out neighbours; "
            "Chua et al., arXiv 2403.17673)"
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
