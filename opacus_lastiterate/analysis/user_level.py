"""The last-iterate heuristic for a user (or a group) of k records (``docs/privacy_units.md``).

A user owns up to k records; each is sampled as the run samples records. The heuristic takes a
user with exactly k records whose clipped gradients are identical (for a linear loss their
contributions add up along one direction: the largest shift the clipping allows), the choice
the record-level heuristic makes for its one canary. With a linear loss
the final model's coordinate along that direction is X + N(0, s^2), s^2 = sum_t w_t^2
sigma_t^2, where X = sum_t w_t C_t and C_t is the number of the user's records in step t's
batch; the heuristic compares P = X + N(0, s^2) with Q = N(0, s^2) (the user's records
removed, or zeroed out for fixed-size batches), delta(eps) = max(H_{e^eps}(P, Q),
H_{e^eps}(Q, P)), as the record-level heuristic does (k = 1 gives its numbers).

* **Poisson** (:class:`UserLevelHeuristic`): C_t ~ Binomial(k, q_t), independent across steps,
  so X is the record-level sum over k copies of every step. With equal weights X is
  Poisson-binomial (Binomial(kT, q) at one rate), the record-level pair with kT Bernoulli
  trials and the *same* noise variance; with weights it is the record-level weighted heuristic
  on the steps repeated k times with noise sigma_t / sqrt(k) per copy (the same s^2). Both
  reuse :mod:`.last_iterate.heuristic_pair` and :mod:`.last_iterate.weighted_heuristic`.
* **Balls-in-bins** (:class:`UserLevelSamplingHeuristic`): each of the k records picks its step
  of each epoch uniformly and independently, so an epoch contributes the sum of k independent
  copies of the record-level epoch contribution.
* **Shuffled batches**: each epoch puts the k records at k distinct slots of a uniform
  permutation of the N records: their slots are a uniform k-subset, drawn without replacement.
  Batch j holds ``|batch j|`` slots (the records cut by ``drop_last`` and the positions of a
  partial epoch outside the run contribute 0). Going through the epoch's steps in order, if m
  of the user's records already sit in earlier batches, the number in this batch is
  Hypergeometric(remaining slots, ``|batch j|``, k - m); the law of (m, X_e) is built step by
  step (a two-dimensional table) and X_e's law is its sum over m.
* **Deterministic order**: the records sit at fixed positions; the heuristic takes the worst
  placement of k records (as the record-level one takes the worst position): fill the
  positions with the largest Delta_j = sum of w_t at position j, each up to its batch size.
  A Gaussian mechanism with mu = X_max / s.

Epochs are independent; X's law is the convolution of the epochs' laws. With equal weights
every contribution is an integer count and the law is computed exactly. With per-step weights
each weight is rounded up (an upper bound: larger shifts make the pair easier to distinguish)
and down (a lower bound) to a grid of N points per largest weight, and N is refined until
(upper - lower) / upper <= ``accuracy``, as :mod:`.sampling_heuristic` does. Tail masses cut
from a table (at most 1e-30 in total) are added to delta.

A heuristic with the caveats of the record-level one: exact for linear losses, not a proven
bound for deep networks; it describes the final model only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import special

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import (
    segments_delta,
    segments_epsilon,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import solve_trusted
from opacus_lastiterate.analysis.privacy_model import PrivacyModel, poisson_run
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, TrainingSegment, as_run
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    UnknownSampling,
)
from opacus_lastiterate.analysis.sampling_heuristic import (
    EpochLayout,
    epoch_scheme_of,
    pair_value,
    trim_tails,
)
from opacus_lastiterate.exceptions import WeightedAccuracyWarning

__all__ = [
    "UserLevelHeuristic",
    "UserLevelSamplingHeuristic",
]

_TRUNCATION = 1e-30  # total tail mass cut from the tables (added to delta)
_ON_GRID = 1e-12
_FIRST_RESOLUTION = 64
_MAX_GRID_POINTS = 20_000_000

_CAVEAT = "final model only; exact for linear losses, not a proven bound for deep networks"


def _label(run: DPSGDRun, scheme_text: str) -> str:
    return f"last-iterate heuristic; {run.unit.label()}; {scheme_text} ({_CAVEAT})"


# -- Poisson ------------------------------------------------------------------------------------


class UserLevelHeuristic(PrivacyModel):
    """The heuristic of a Poisson-sampled run for its privacy unit (``run.unit``, k records):
    the record-level pair with every step's count Binomial(k, q_t) (module docstring). k = 1
    is :class:`~.last_iterate.heuristic.LastIterateHeuristic`'s number.

    Args:
        run: a run with Poisson (or unspecified) sampling.
        accuracy: relative accuracy of the weighted path (runs with ``weights``), in (0, 1).
    """

    kind = "heuristic"
    units = True

    def __init__(self, run: RunLike, *, accuracy: float = 1e-3) -> None:
        self.run = poisson_run(run, model="UserLevelHeuristic", name="heuristic")
        self.accuracy = check_in_interval("accuracy", accuracy, 0.0, 1.0)
        self.records = self.run.unit.max_records

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which unit."""
        return _label(self.run, "each record Poisson-sampled")

    def _value(self, quantity: str, argument: float) -> float:
        k = self.records
        root = math.sqrt(k)
        if self.run.weights is None:
            segments = tuple(
                TrainingSegment(s.noise_multiplier / root, s.sample_rate, s.steps * k)
                for s in self.run.segments
            )
            if quantity == "epsilon":
                return segments_epsilon(segments, argument)
            return segments_delta(segments, argument)
        sigma, q = self.run.per_step()
        w = np.asarray(self.run.weights)
        keep = w > 0
        result = solve_trusted(
            quantity,
            argument,
            np.repeat(w[keep], k),
            np.repeat(q[keep], k),
            np.repeat(sigma[keep], k) / root,
            self.accuracy,
        )
        return float(result.value)

    def _epsilon(self, delta: float) -> float:
        return self._value("epsilon", delta)

    def _delta(self, epsilon: float) -> float:
        return self._value("delta", epsilon)

    def __repr__(self) -> str:
        return f"UserLevelHeuristic(records={self.records}, steps={self.run.num_steps})"


# -- epoch schemes ------------------------------------------------------------------------------


def _log_choose(n: np.ndarray, r: np.ndarray) -> np.ndarray:
    return special.gammaln(n + 1) - special.gammaln(r + 1) - special.gammaln(n - r + 1)


def _hypergeometric_table(remaining: int, slots: int, draws: np.ndarray) -> np.ndarray:
    """pmf[c, m] = Pr[c of ``draws[m]`` uniform distinct slots among ``remaining`` fall in
    ``slots`` given slots], c = 0..max(draws); 0 where impossible."""
    c = np.arange(int(draws.max()) + 1, dtype=float)[:, None]
    d = draws[None, :].astype(float)
    possible = (c <= d) & (c <= slots) & (d - c <= remaining - slots) & (d <= remaining)
    with np.errstate(invalid="ignore"):
        log_pmf = (
            _log_choose(np.float64(slots), c)
            + _log_choose(np.float64(remaining - slots), d - c)
            - _log_choose(np.float64(remaining), d)
        )
    table = np.where(possible, np.exp(np.where(possible, log_pmf, 0.0)), 0.0)
    # Where c = 0 is possible, the ratio recurrence from Pr[C = 0] keeps full relative
    # precision (the log-gamma differences above lose about 1e-10 at N = 50,000).
    easy = draws <= remaining - slots
    if np.any(easy):
        de = draws[easy].astype(float)
        i = np.arange(int(de.max()), dtype=float)
        log_p0 = np.concatenate([[0.0], np.cumsum(np.log1p(-slots / (remaining - i)))])
        rows = [np.exp(log_p0[draws[easy]])]
        for ci in range(int(c[-1, 0])):
            ratio = (slots - ci) * (de - ci) / ((ci + 1) * (remaining - slots - de + ci + 1))
            rows.append(rows[-1] * np.clip(ratio, 0.0, None))
        table[:, easy] = np.array(rows)
    return table


def _shuffled_epoch(
    units: np.ndarray, slots: np.ndarray, total: int, k: int, budget: float
) -> tuple[np.ndarray, float]:
    """Law of X_e = sum_j units_j C_j on the integers, C ~ multivariate hypergeometric: k
    distinct slots out of ``total``, ``slots[j]`` of them at position j (module docstring).
    Returns (pmf from 0, dropped mass)."""
    table = np.zeros((k + 1, 1))
    table[0, 0] = 1.0
    remaining = total
    dropped = 0.0
    draws = k - np.arange(k + 1)
    for u, n in zip(units.tolist(), slots.tolist(), strict=True):
        pmf = _hypergeometric_table(remaining, n, draws)
        tails = np.cumsum(pmf[::-1], axis=0)[::-1]  # tails[c, m] = Pr[C >= c]
        mass = table.sum(axis=1)
        cap = pmf.shape[0] - 1
        while cap > 0 and float(np.dot(tails[cap], mass)) <= budget:
            cap -= 1
        if cap + 1 < pmf.shape[0]:
            dropped += float(np.dot(tails[cap + 1], mass))
        width = table.shape[1]
        new = np.zeros((k + 1, width + cap * u))
        for c in range(cap + 1):
            new[c:, c * u : c * u + width] += table[: k + 1 - c] * pmf[c, : k + 1 - c, None]
        table = new
        remaining -= n
    return table.sum(axis=0), dropped


def _balls_epoch(units: np.ndarray, steps_per_epoch: int, k: int) -> np.ndarray:
    """Law of the sum of k independent copies of one record's epoch contribution (each step
    of the epoch with probability 1 / steps_per_epoch), as a pmf from 0."""
    one = np.zeros(int(units.max()) + 1)
    np.add.at(one, units, 1.0 / steps_per_epoch)
    one[0] += max(0.0, 1.0 - units.size / steps_per_epoch)
    law = np.ones(1)
    for _ in range(k):
        law = np.convolve(law, one)
    return law


def _epoch_parts(layout: EpochLayout) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per epoch: (w_t > 0 of its steps inside the run, the slots of their positions)."""
    out = []
    bounds = np.flatnonzero(np.diff(layout.epoch)) + 1
    for idx in np.split(np.arange(layout.epoch.size), bounds):
        idx = idx[layout.weights[idx] > 0]
        if idx.size:
            out.append((layout.weights[idx], layout.slots[layout.position[idx]]))
    return out


def _equal_weights(w: np.ndarray) -> bool:
    positive = w[w > 0]
    return positive.size == 0 or float(positive.min()) >= float(positive.max()) * (1 - _ON_GRID)


def _law(
    layout: EpochLayout, scheme: object, k: int, resolution: int, rounding: str
) -> tuple[int, np.ndarray, float]:
    parts = _epoch_parts(layout)
    w_max = float(layout.weights.max()) if layout.weights.size else 0.0
    equal = _equal_weights(layout.weights)
    budget = _TRUNCATION / (2 * max(1, len(parts)) * (k + 1))
    offset, law, dropped = 0, np.ones(1), 0.0
    for w, slots in parts:
        if equal:
            units = np.full(w.size, resolution, dtype=np.int64)
        else:
            x = w / w_max * resolution
            units = (np.ceil(x) if rounding == "up" else np.floor(x)).astype(np.int64)
        if isinstance(scheme, BallsInBins):
            epoch, cut = _balls_epoch(units, scheme.steps_per_epoch, k), 0.0
        else:
            epoch, cut = _shuffled_epoch(units, slots, layout.denominator, k, budget)
        law = np.convolve(law, epoch)
        law, lo, trimmed = trim_tails(law, budget)
        offset += lo
        dropped += cut + trimmed
    return offset, law, min(1.0, dropped)


def _pair(
    layout: EpochLayout, scheme: object, k: int, resolution: int, rounding: str
) -> ShiftedGaussianMixture | None:
    offset, pmf, dropped = _law(layout, scheme, k, resolution, rounding)
    support = (offset + np.arange(pmf.size)) / resolution
    if support[-1] == 0:
        return None
    with np.errstate(divide="ignore"):
        log_pmf = np.log(pmf)
    scale = layout.noise_scale / float(layout.weights.max())
    return ShiftedGaussianMixture(support, log_pmf, scale, dropped if rounding == "up" else 0.0)


def _worst_placement(layout: EpochLayout, k: int) -> float:
    """Deterministic order: the largest sum of Delta_j over k records placed at most
    ``|batch j|`` per position j."""
    sums = layout.position_sums()
    total, left = 0.0, k
    for j in np.argsort(-sums, kind="stable"):
        take = min(left, int(layout.slots[j]))
        total += take * float(sums[j])
        left -= take
        if left == 0:
            break
    return total


def _solve(
    layout: EpochLayout,
    scheme: object,
    k: int,
    evaluate: Callable[[ShiftedGaussianMixture | float], float],
    accuracy: float,
) -> float:
    w = layout.weights
    if w.size == 0 or float(w.max()) == 0.0:
        return 0.0
    if isinstance(scheme, DeterministicBatches):
        return evaluate(_worst_placement(layout, k) / layout.noise_scale)
    if _equal_weights(w):  # integer counts: exact at resolution 1
        pair = _pair(layout, scheme, k, 1, "up")
        return 0.0 if pair is None else evaluate(pair)
    n = _FIRST_RESOLUTION
    epochs = len(_epoch_parts(layout))
    while True:
        upper_pair = _pair(layout, scheme, k, n, "up")
        upper = 0.0 if upper_pair is None else evaluate(upper_pair)
        lower_pair = _pair(layout, scheme, k, n, "down")
        lower = 0.0 if lower_pair is None else evaluate(lower_pair)
        rel = 0.0 if upper == 0 else ((upper - lower) / upper if math.isfinite(upper) else 0.0)
        if rel <= accuracy:
            return upper
        wanted = max(2 * n, math.ceil(n * 1.25 * rel / accuracy))
        if wanted * k * (epochs + 1) > _MAX_GRID_POINTS:
            warn(
                f"user-level heuristic: reached relative accuracy {rel:.3g}, not the requested "
                f"{accuracy:g}, at the grid-size limit (resolution {n}); the value is still "
                "an upper bound.",
                WeightedAccuracyWarning,
            )
            return upper
        n = wanted


class UserLevelSamplingHeuristic(PrivacyModel):
    """The heuristic of a run with shuffled, deterministic or balls-in-bins batches for its
    privacy unit (``run.unit``, k records; module docstring). k = 1 is
    :class:`~.sampling_heuristic.SamplingHeuristic`'s number.

    Args:
        run: a run whose ``sampling`` is an epoch scheme (or an unknown sampler assuming one).
        accuracy: relative accuracy of the grid for per-step weights, in (0, 1).

    Raises:
        ValueError: the unit holds more records than the dataset (fixed-size batches).
    """

    kind = "heuristic"
    units = True

    def __init__(self, run: RunLike, *, accuracy: float = 1e-3) -> None:
        self.run = as_run(run)
        self.scheme = epoch_scheme_of(self.run)
        self.accuracy = check_in_interval("accuracy", accuracy, 0.0, 1.0)
        self.records = self.run.unit.max_records
        if not isinstance(self.scheme, BallsInBins) and self.records > self.scheme.dataset_size:
            raise ValueError(
                f"`run.unit.max_records` ({self.records}) must be at most the dataset size "
                f"{self.scheme.dataset_size}."
            )

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which unit and scheme."""
        assumes = "assumes " if isinstance(self.run.sampling, UnknownSampling) else ""
        return _label(self.run, f"{assumes}{self.run.sampling.describe()}")  # type: ignore[union-attr]

    def _value(self, quantity: str, argument: float) -> float:
        layout = EpochLayout(self.run, self.scheme)

        return _solve(layout, self.scheme, self.records,
                      lambda pair: pair_value(pair, quantity, argument), self.accuracy)

    def _epsilon(self, delta: float) -> float:
        return self._value("epsilon", delta)

    def _delta(self, epsilon: float) -> float:
        return self._value("delta", epsilon)

    def __repr__(self) -> str:
        return (
            f"UserLevelSamplingHeuristic({self.scheme.name}, records={self.records}, "
            f"steps={self.run.num_steps})"
        )
