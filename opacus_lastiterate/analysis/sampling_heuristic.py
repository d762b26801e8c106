"""The last-iterate heuristic for runs whose batches come in epochs (``docs/samplers.md``).

Shuffled, deterministic and balls-in-bins batches use a record at most once per epoch. With a
linear loss the final model is theta_0 - sum_t w_t (g_t + Z_t), Z_t ~ N(0, sigma_t^2) (units
of the clipping norm), and the canary's gradient enters g_t only at the step where its epoch
put it. Against the neighbour whose canary contributes nothing (zero-out neighbours: same
dataset size, same batches; the other records contributing nothing along the canary's
direction, the worst case of the Poisson heuristic) the pair is

    P = sum_e X_e + N(0, s^2),   Q = N(0, s^2),   s^2 = sum_t w_t^2 sigma_t^2,

with X_e the canary's weighted contribution in epoch e, independent across epochs:

* shuffled batches: X_e = w_t with probability ``|batch j(t)| / N`` for each step t of epoch e
  (its batch is the one holding its slot of a uniform permutation), 0 with the rest of the
  probability (the records dropped by ``drop_last``, and the positions of epoch e outside the
  run: a partial first or last epoch);
* balls-in-bins: the same with probability 1 / steps_per_epoch per step;
* deterministic order: the canary sits at one fixed position j of every epoch, so
  P = N(Delta_j, s^2) with Delta_j = sum of w_t over the steps at position j, a Gaussian
  mechanism; the heuristic takes the worst position, mu = max_j Delta_j / s.

delta(eps) = max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) as for Poisson
(:class:`~.last_iterate.gaussian_mixture.ShiftedGaussianMixture`).

**Computation.**

* Equal weights (plain SGD at a constant learning rate, any noise multipliers): the count of
  epochs that use the canary is a Poisson-binomial sum of Bernoulli(P_e), P_e the epoch's
  probability mass inside the run, computed exactly (:mod:`.last_iterate.canary_count`). With
  whole epochs and no dropped records every P_e is 1: P = N(E, s^2), a Gaussian mechanism
  with mu = E / s (= E / (sigma sqrt(T)) at constant sigma), evaluated in closed form.
* Per-step weights (schedules, momentum): the law of sum_e X_e is built by convolving the
  per-epoch laws. Exactly (one support point per distinct sum) while the support has at most
  :data:`EXACT_SUPPORT_LIMIT` points; otherwise each weight is rounded *up* to a grid of N
  points per largest weight (an upper bound: larger shifts only make the pair easier to
  distinguish, the argument of :mod:`.last_iterate.weighted_heuristic`) and *down* (a lower
  bound), and N is refined until (upper - lower) / upper <= ``accuracy``. Tails of at most
  1e-30 in total are cut and added to delta.

Only the heuristic's caveats apply: exact for linear losses in which the other records carry
no information about where the canary was; a heuristic, not a proven bound, for deep networks.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
    gaussian_delta,
    gaussian_epsilon,
)
from opacus_lastiterate.analysis.last_iterate.canary_count import poisson_binomial_count
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    EpochScheme,
    ShuffledBatches,
    UnknownSampling,
    effective_sampling,
)
from opacus_lastiterate.exceptions import WeightedAccuracyWarning

__all__ = []

EXACT_SUPPORT_LIMIT = 20_000
"""Largest support of sum_e X_e computed exactly; beyond it the certified grid is used."""
_TRUNCATION = 1e-30
_ON_GRID = 1e-12
_FIRST_RESOLUTION = 64
_MAX_GRID_POINTS = 20_000_000


def epoch_scheme_of(run: DPSGDRun) -> EpochScheme:
    """The epoch scheme the run's numbers are computed for (``assumed`` of an unknown
    sampler); ``ValueError`` when the run is not an epoch scheme."""
    scheme = effective_sampling(run.sampling)
    if not isinstance(scheme, (ShuffledBatches, DeterministicBatches, BallsInBins)):
        raise ValueError(
            "`run.sampling` must be ShuffledBatches, DeterministicBatches or BallsInBins "
            f"(or UnknownSampling assuming one of them), got {run.sampling!r}."
        )
    return scheme


class EpochLayout:
    """Where each step of a run sits in its epoch, and the canary's chance to be there.

    Attributes:
        weights: w_t, one per step (ones for plain SGD).
        sigmas: sigma_t, one per step.
        epoch: the epoch index of each step (0 for the first, possibly partial, epoch).
        position: the step's position in its epoch, 0..steps_per_epoch - 1.
        slots: integer numerators of the per-position probabilities (batch sizes for the
            fixed-size schemes, ones for balls-in-bins), one per position.
        denominator: N for the fixed-size schemes, steps_per_epoch for balls-in-bins.
    """

    __slots__ = ("denominator", "epoch", "position", "sigmas", "slots", "weights")

    def __init__(self, run: DPSGDRun, scheme: EpochScheme) -> None:
        sigma, _ = run.per_step()
        t = np.arange(run.num_steps)
        k = scheme.steps_per_epoch
        shifted = scheme.first_step_in_epoch + t
        self.weights = np.ones(run.num_steps) if run.weights is None else np.asarray(run.weights)
        self.sigmas = sigma
        self.epoch = shifted // k
        self.position = shifted % k
        if isinstance(scheme, BallsInBins):
            self.slots, self.denominator = np.ones(k, dtype=np.int64), k
        else:
            self.slots = np.asarray(scheme.batch_sizes, dtype=np.int64)
            self.denominator = scheme.dataset_size

    @property
    def noise_scale(self) -> float:
        """s = sqrt(sum_t w_t^2 sigma_t^2)."""
        return math.sqrt(float(np.sum((self.weights * self.sigmas) ** 2)))

    def epoch_options(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per epoch: (the weights w_t of its steps, their probabilities ``|batch| / N``)."""
        out = []
        bounds = np.flatnonzero(np.diff(self.epoch)) + 1
        for idx in np.split(np.arange(self.epoch.size), bounds):
            if idx.size:
                out.append(
                    (self.weights[idx], self.slots[self.position[idx]] / self.denominator)
                )
        return out

    def epoch_masses(self) -> list[tuple[int, int]]:
        """Per epoch: (slots of its steps inside the run with a positive weight, denominator):
        the probability that the epoch uses the canary, as an exact fraction."""
        out = []
        bounds = np.flatnonzero(np.diff(self.epoch)) + 1
        for idx in np.split(np.arange(self.epoch.size), bounds):
            idx = idx[self.weights[idx] > 0]
            if idx.size:
                out.append((int(self.slots[self.position[idx]].sum()), self.denominator))
        return out

    def position_sums(self) -> np.ndarray:
        """Delta_j = sum of w_t over the steps at position j (deterministic order)."""
        return np.bincount(self.position, weights=self.weights, minlength=self.slots.size)


def epoch_layout(run: RunLike) -> EpochLayout:
    """The :class:`EpochLayout` of a run with an epoch scheme."""
    r = as_run(run)
    return EpochLayout(r, epoch_scheme_of(r))


# -- the pair ------------------------------------------------------------------------------------


def _equal_weights(w: np.ndarray) -> bool:
    positive = w[w > 0]
    return positive.size == 0 or float(positive.min()) >= float(positive.max()) * (1 - _ON_GRID)


def _count_pair(layout: EpochLayout) -> ShiftedGaussianMixture | float:
    """Equal weights: the Poisson-binomial count of epochs that use the canary; returns mu
    (a float) when the count is certain (a Gaussian mechanism)."""
    w = layout.weights
    w_max = float(w.max())
    scale = layout.noise_scale / w_max
    by_rate: dict[float, int] = defaultdict(int)
    certain = 0
    for used, total in layout.epoch_masses():
        if used == total:
            certain += 1
        elif used:
            by_rate[used / total] += 1
    if not by_rate:
        return certain / scale
    parts = [(n, q) for q, n in sorted(by_rate.items())]
    count = poisson_binomial_count(parts)
    count = type(count)(count.offset + certain, count.log_pmf, count.dropped_mass)
    return count_pair(count, scale * scale)


def _exact_sum(options: list[tuple[np.ndarray, np.ndarray]]) -> dict[float, float] | None:
    """Law of sum_e X_e as {value: probability}, or None beyond EXACT_SUPPORT_LIMIT points.

    Each convolution runs on arrays: the pairwise sums in the order of a loop over the law's
    points then the option's, grouped by value in order of first appearance and summed in
    that order (``np.bincount``), which are the additions, in the same order, of a
    dictionary filled by that loop: the same floats."""
    values_now, probs_now = np.zeros(1), np.ones(1)
    for values, probs in options:
        step: dict[float, float] = defaultdict(float)
        for v, p in zip(values.tolist(), probs.tolist(), strict=True):
            step[v] += p
        step[0.0] += max(0.0, 1.0 - float(probs.sum()))
        kept = [(v, p) for v, p in step.items() if p > 0]
        b_values = np.array([v for v, _ in kept], dtype=float)
        b_probs = np.array([p for _, p in kept], dtype=float)
        sums = (values_now[:, None] + b_values[None, :]).ravel()
        masses = (probs_now[:, None] * b_probs[None, :]).ravel()
        unique, first, inverse = np.unique(sums, return_index=True, return_inverse=True)
        if unique.size > EXACT_SUPPORT_LIMIT:
            return None
        order = np.argsort(first, kind="stable")  # groups by first appearance
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        probs_now = np.bincount(  # type: ignore[assignment]
            rank[inverse.ravel()], weights=masses, minlength=order.size)
        values_now = sums[first[order]]
    return dict(zip(values_now.tolist(), probs_now.tolist(), strict=True))


def trim_tails(pmf: np.ndarray, budget: float) -> tuple[np.ndarray, int, float]:
    """``pmf`` without its leading and trailing masses whose cumulative sums are at most
    ``budget`` each, the index of its first kept point and the mass cut."""
    c = np.cumsum(pmf)
    i = int(np.searchsorted(c, budget, side="right"))
    r = np.cumsum(pmf[::-1])
    j = int(np.searchsorted(r, budget, side="right"))
    if i + j >= pmf.size:
        return pmf, 0, 0.0
    return pmf[i : pmf.size - j], i, (float(c[i - 1]) if i else 0.0) + (float(r[j - 1]) if j else 0.0)


def _grid_pair(
    options: list[tuple[np.ndarray, np.ndarray]], w_max: float, scale: float, n: int, up: bool
) -> ShiftedGaussianMixture | None:
    offset, pmf, dropped = 0, np.ones(1), 0.0
    budget = _TRUNCATION / (2 * max(1, len(options)))
    for values, probs in options:
        x = values / w_max * n
        units = (np.ceil(x) if up else np.floor(x)).astype(np.int64)
        factor = np.zeros(int(units.max()) + 1)
        np.add.at(factor, units, probs)
        factor[0] += max(0.0, 1.0 - float(probs.sum()))
        pmf = np.convolve(pmf, factor)
        pmf, cut_lo, cut = trim_tails(pmf, budget)
        offset += cut_lo
        dropped += cut
    support = (offset + np.arange(pmf.size)) / n
    if support[-1] == 0:
        return None
    with np.errstate(divide="ignore"):
        log_pmf = np.log(pmf)
    return ShiftedGaussianMixture(support, log_pmf, scale, dropped if up else 0.0)


def _solve(layout: EpochLayout, evaluate: Callable[[ShiftedGaussianMixture | float], float],
           accuracy: float) -> float:
    """The heuristic's value (epsilon or delta, by ``evaluate``) for a random-position scheme."""
    w = layout.weights
    if float(w.max()) == 0.0:
        return 0.0
    if _equal_weights(w):
        return evaluate(_count_pair(layout))
    w_max = float(w.max())
    scale = layout.noise_scale / w_max
    options = [(v[v > 0], p[v > 0]) for v, p in layout.epoch_options()]
    options = [o for o in options if o[0].size]
    law = _exact_sum(options)
    if law is not None:
        values = np.array(list(law.keys())) / w_max
        probs = np.array(list(law.values()))
        with np.errstate(divide="ignore"):
            return evaluate(ShiftedGaussianMixture(values, np.log(probs), scale))
    n = _FIRST_RESOLUTION
    while True:
        upper_pair = _grid_pair(options, w_max, scale, n, up=True)
        upper = 0.0 if upper_pair is None else evaluate(upper_pair)
        lower_pair = _grid_pair(options, w_max, scale, n, up=False)
        lower = 0.0 if lower_pair is None else evaluate(lower_pair)
        rel = 0.0 if upper == 0 else ((upper - lower) / upper if math.isfinite(upper) else 0.0)
        if rel <= accuracy:
            return upper
        wanted = max(2 * n, math.ceil(n * 1.25 * rel / accuracy))
        if wanted * (len(options) + 1) > _MAX_GRID_POINTS:
            warn(
                f"sampling heuristic: reached relative accuracy {rel:.3g}, not the requested "
                f"{accuracy:g}, at the grid-size limit (resolution {n}); the value is still an "
                "upper bound.",
                WeightedAccuracyWarning,
            )
            return upper
        n = wanted


def pair_value(pair: ShiftedGaussianMixture | float, quantity: str, argument: float) -> float:
    """epsilon at delta = ``argument`` (``quantity`` ``"epsilon"``) or delta at epsilon of a
    pair, or of the Gaussian mechanism with mu = ``pair`` when it is a float."""
    if isinstance(pair, float):
        if quantity == "epsilon":
            return gaussian_epsilon(mu=pair, delta=argument)
        return gaussian_delta(mu=pair, epsilon=argument)
    return pair.epsilon(argument) if quantity == "epsilon" else pair.delta(argument)


def _value(run: DPSGDRun, quantity: str, argument: float, accuracy: float) -> float:
    scheme = epoch_scheme_of(run)
    layout = EpochLayout(run, scheme)

    if isinstance(scheme, DeterministicBatches):
        delta_max = float(layout.position_sums().max())
        mu = delta_max / layout.noise_scale if delta_max > 0 else 0.0
        return pair_value(mu, quantity, argument)
    return _solve(layout, lambda pair: pair_value(pair, quantity, argument), accuracy)


def _label(run: DPSGDRun, what: str) -> str:
    assumes = "assumes " if isinstance(run.sampling, UnknownSampling) else ""
    text = run.sampling.describe() if run.sampling is not None else "Poisson sampling"
    return (
        f"{what} for {assumes}{text} (final model only; exact for linear losses, "
        "not a proven bound for deep networks)"
    )


class SamplingHeuristic(PrivacyModel):
    """The last-iterate heuristic of a run with shuffled, deterministic or balls-in-bins
    batches (module docstring): ``epsilon(delta)``, ``delta(epsilon)``.

    Args:
        run: a run whose ``sampling`` is an epoch scheme (or an unknown sampler assuming one).
        accuracy: relative accuracy of the certified grid (weighted runs with a large support
            only), in (0, 1).
    """

    kind = "heuristic"

    def __init__(self, run: RunLike, *, accuracy: float = 1e-3) -> None:
        self.run = as_run(run)
        self.scheme = epoch_scheme_of(self.run)
        self.accuracy = check_in_interval("accuracy", accuracy, 0.0, 1.0)

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which sampling scheme."""
        return _label(self.run, "last-iterate heuristic")

    def _epsilon(self, delta: float) -> float:
        return _value(self.run, "epsilon", delta, self.accuracy)

    def _delta(self, epsilon: float) -> float:
        return _value(self.run, "delta", epsilon, self.accuracy)

    def __repr__(self) -> str:
        return f"SamplingHeuristic({self.scheme.name}, steps={self.run.num_steps})"


class RobustSamplingHeuristic(PrivacyModel):
    """max over t <= T of the heuristic of the run's last t steps (what a regulariser that
    zeroes the model would expose), for an epoch scheme; every suffix is evaluated (each
    value is never below its exact value, so the maximum is an upper bound on the exact
    maximum). Runs with equal weights only, as the Poisson robust heuristic."""

    kind = "heuristic"

    def __init__(self, run: RunLike) -> None:
        self.run = as_run(run)
        self.scheme = epoch_scheme_of(self.run)
        if self.run.weights is not None and not _equal_weights(np.asarray(self.run.weights)):
            raise ValueError(
                "`run` must have no per-step weights (or equal ones): the robust maximum is "
                "computed for plain SGD at a constant learning rate."
            )

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which sampling scheme."""
        return _label(self.run, "robust last-iterate heuristic (max over the last t <= T steps)")

    def _each(self, quantity: str, argument: float) -> float:
        best = 0.0
        for t in range(1, self.run.num_steps + 1):
            best = max(best, _value(self.run.suffix(t), quantity, argument, 1e-3))
        return best

    def _epsilon(self, delta: float) -> float:
        return self._each("epsilon", delta)

    def _delta(self, epsilon: float) -> float:
        return min(1.0, self._each("delta", epsilon))

    def __repr__(self) -> str:
        return f"RobustSamplingHeuristic({self.scheme.name}, steps={self.run.num_steps})"
