"""The last-iterate heuristic for per-step weights (learning-rate schedules, momentum).

With a linear loss the final model is m_0 minus a weighted sum of the noisy gradients
(:mod:`opacus_lastiterate.analysis.last_iterate.optimizer_weights`), so the heuristic pair becomes
(``docs/last_iterate.md``, "Per-step weights: schedules and momentum")

    P = sum_t w_t Bernoulli(q_t) + N(0, s^2),   Q = N(0, s^2),   s^2 = sum_t w_t^2 sigma_t^2,

with delta(eps) = max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) as for the constant-rate heuristic.
The pair is invariant under a common rescaling of the weights, so only their ratios matter.

Computation
-----------
* Constant weights (all positive w_t equal, to a relative 1e-12): the count is
  Poisson-binomial and the exact path of :mod:`opacus_lastiterate.analysis.last_iterate.heuristic_pair` is
  used, so the result equals the constant-rate heuristic (bit for bit when q and sigma are
  constant as well). Steps with w_t = 0 add neither signal nor noise and are left out.
* General weights: with u_t = w_t / max_s w_s and a resolution N, each u_t is rounded *up*
  to k_t / N, k_t = ceil(N u_t), and the integer variable K = sum_t k_t Bernoulli(q_t) is
  computed exactly on the grid {0, 1, 2, ...}; its law, with shifts K / N, goes to
  :class:`ShiftedGaussianMixture` with the exact noise s. Rounding shifts up can only make
  the pair easier to distinguish (Lemma 4.5 of Choquette-Choo, Ganesh, Steinke, Thakurta,
  "Privacy Amplification for Matrix Mechanisms", arXiv 2310.15526, as used in Section 4.2
  of the paper; ``docs/last_iterate.md``, "Rounding up by stochastic domination"), so the
  returned value is on the safe side of
  the exact weighted heuristic. Rounding *down* (k_t = floor(N u_t)) gives a lower bound
  by the same lemma, so ``(upper - lower) / upper`` bounds the relative over-estimate. N
  starts at 64 and jumps to the resolution predicted from the first gap (the gap shrinks
  like 1/N), doubling if needed, until the bound is at most the requested ``accuracy``. Weights within a relative
  1e-12 of a grid point count as on it (far below the floating-point noise of the rates).
* Convolution: steps that share (k_t, q_t) are merged into one k * Binomial(n, q) factor
  (:func:`~opacus_lastiterate.analysis.last_iterate.canary_count.binomial_count`, tails beyond its
  Bernstein window dropped and accounted), and the factors are convolved *directly* in
  linear space. Every operation adds non-negative numbers, so each grid mass keeps its
  relative precision down to the smallest normal double; FFT convolution was rejected
  because its absolute error (about 1e-16 of the largest mass) would swamp the tail masses
  that decide delta at 1e-6..1e-12. After each factor, the masses at each end whose
  cumulative sum is at most 1e-30 / (2 x number of factors) are cut; all cut and dropped
  masses are added to delta (upper bound) and left out of the lower bound.
* Cost: about (number of distinct (k_t, q_t)) x (grid length) additions, the grid length
  being about N (sum_t u_t q_t + a few standard deviations); N is about 3 / accuracy for
  smooth schedules. Measured (one core): cosine schedule, T = 1000, q = 0.01: 1.3 s at
  accuracy 1e-3; T = 5000: 10 s at 1e-3, 0.8 s at 1e-2. Beyond 2e7 grid points the
  refinement stops with a :class:`WeightedAccuracyWarning` (the value stays an upper bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
    check_int,
    check_noise_multiplier,
    check_real,
    check_sample_rate,
)
from opacus_lastiterate.analysis.last_iterate.canary_count import binomial_count
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import (
    segments_delta,
    segments_epsilon,
)
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment, append_steps
from opacus_lastiterate.exceptions import WeightedAccuracyWarning

__all__ = [
    "WeightedHeuristicResult",
]

ArrayLike = Sequence[float] | np.ndarray
PerStep = float | Sequence[float] | np.ndarray

_TRUNCATION = 1e-30  # total end mass cut from the grid distribution (added to delta)
_ON_GRID = 1e-12  # relative tolerance for a weight to count as lying on a grid point
_FIRST_RESOLUTION = 64
_MAX_RESOLUTION = 1 << 24
_MAX_GRID_POINTS = 20_000_000


@dataclass(frozen=True)
class WeightedHeuristicResult:
    """Epsilon or delta of the weighted heuristic, with the accuracy achieved.

    Attributes:
        value: the returned epsilon (``weighted_heuristic_epsilon_result``) or delta
            (``weighted_heuristic_delta_result``); an upper bound on the exact weighted heuristic
            (weights rounded up, truncated mass added).
        lower_bound: the same quantity with the weights rounded down (a lower bound on the
            exact weighted heuristic, up to the < 1e-30 truncated mass).
        relative_accuracy: (value - lower_bound) / value, a bound on the relative amount by
            which ``value`` exceeds the exact weighted heuristic (0 on the exact path).
        requested_accuracy: the ``accuracy`` argument.
        exact: True on the constant-weight path (no rounding).
        resolution: grid points per largest weight N (0 on the exact path).
        support_size: number of grid points of the shift distribution used for ``value``.
        dropped_mass: probability mass of P cut or dropped, included in ``value``.
        steps: number of steps with a positive weight.
        delta: the target delta (for epsilon) or the epsilon argument (for delta).
    """

    value: float
    lower_bound: float
    relative_accuracy: float
    requested_accuracy: float
    exact: bool
    resolution: int
    support_size: int
    dropped_mass: float
    steps: int
    quantity: str
    argument: float

    @property
    def epsilon(self) -> float:
        """The epsilon: ``value`` for an epsilon result, the argument for a delta result."""
        return self.value if self.quantity == "epsilon" else self.argument

    @property
    def delta(self) -> float:
        """The delta: ``value`` for a delta result, the target for an epsilon result."""
        return self.value if self.quantity == "delta" else self.argument

    @property
    def converged(self) -> bool:
        """Whether ``relative_accuracy <= requested_accuracy``."""
        return self.relative_accuracy <= self.requested_accuracy

    def __float__(self) -> float:
        return float(self.value)


# -- argument handling ---------------------------------------------------------------------


def _real_array(name: str, value: object) -> np.ndarray:
    if isinstance(value, (str, bytes)):
        raise TypeError(f"`{name}` must be a real number or a sequence of them, got {value!r}.")
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"`{name}` must be a real number or a sequence of them, got {value!r}."
        ) from None
    if arr.dtype.kind not in "iuf":
        if arr.ndim == 0:
            check_real(name, value)
        elif arr.ndim == 1 and isinstance(value, Sequence):  # name the first bad entry
            for i, v in enumerate(value):
                check_real(f"{name}[{i}]", v)
        raise TypeError(f"`{name}` must hold real numbers, got dtype {arr.dtype}.")
    if arr.ndim > 1:
        raise ValueError(
            f"`{name}` must be a scalar or a one-dimensional sequence, got shape {arr.shape}."
        )
    return arr.astype(float)


def _per_step(
    name: str, value: PerStep, n: int, check: Callable[[object, str], float]
) -> np.ndarray:
    arr = _real_array(name, value)
    if arr.ndim == 0:
        return np.full(n, check(float(arr), name))
    if arr.size != n:
        raise ValueError(f"`{name}` must have one entry per weight ({n}), got {arr.size}.")
    for i in range(n):  # vectorised screening would duplicate the range logic of `check`
        check(float(arr[i]), f"{name}[{i}]")
    return arr


def _steps(weights: ArrayLike, sample_rates: PerStep, noise_multipliers: PerStep):
    w = _real_array("weights", weights)
    if w.ndim != 1:
        raise ValueError(f"`weights` must be a one-dimensional sequence, got {weights!r}.")
    bad = np.flatnonzero(~(np.isfinite(w) & (w >= 0)))
    if bad.size:
        i = int(bad[0])
        check_in_interval(f"weights[{i}]", float(w[i]), 0.0, math.inf, low_open=False)
    q = _per_step("sample_rates", sample_rates, w.size, lambda v, n: check_sample_rate(v, n))
    sigma = _per_step(
        "noise_multipliers", noise_multipliers, w.size, lambda v, n: check_noise_multiplier(v, n)
    )
    keep = w > 0  # a step with weight 0 adds neither signal nor noise
    return w[keep], q[keep], sigma[keep]


# -- the grid distribution -------------------------------------------------------------------


def _strided_convolve(p: np.ndarray, f: np.ndarray, k: int) -> np.ndarray:
    """out[i] = sum_j f[j] p[i - j k], by direct (non-negative) summation."""
    n, m = p.size, f.size
    if m == 1:
        return p * f[0]
    out = np.zeros(n + k * (m - 1))
    if m <= min(k, n):
        for j in range(m):
            out[j * k : j * k + n] += f[j] * p
    else:  # one ordinary convolution per residue class mod k
        for r in range(min(k, n)):
            conv = np.convolve(p[r::k], f)
            out[r::k][: conv.size] = conv
    return out


def _cut_length(p: np.ndarray, budget: float) -> tuple[int, float]:
    """Largest i with sum(p[:i]) <= budget, and that sum; scans a growing prefix only."""
    m = 256
    while True:
        c = np.cumsum(p[:m])
        i = int(np.searchsorted(c, budget, side="right"))
        if i < c.size or m >= p.size:
            return i, (float(c[i - 1]) if i else 0.0)
        m *= 4


def _trim(p: np.ndarray, budget: float) -> tuple[np.ndarray, int, float]:
    """Cut leading and trailing masses whose cumulative sums are <= budget each."""
    i, cut_lo = _cut_length(p, budget)
    j, cut_hi = _cut_length(p[::-1], budget)
    if i + j >= p.size:
        return p, 0, 0.0
    return p[i : p.size - j], i, cut_lo + cut_hi


def weighted_sum_distribution(
    units: ArrayLike, sample_rates: PerStep
) -> tuple[int, np.ndarray, float]:
    """Law of K = sum_t k_t Bernoulli(q_t) for integer units k_t >= 0.

    Returns ``(offset, pmf, dropped_mass)``: Pr[K = offset + i] = pmf[i] (linear space, the
    pmf sums to 1 - dropped_mass). Direct convolution of merged binomial factors; see the
    module docstring for the truncation.
    """
    k_arr = np.asarray(units)
    if k_arr.ndim != 1 or k_arr.dtype.kind not in "iu":
        raise TypeError("`units` must be a one-dimensional array of integers.")
    q = _per_step("sample_rates", sample_rates, k_arr.size, lambda v, n: check_sample_rate(v, n))
    if np.any(k_arr < 0):
        i = int(np.flatnonzero(k_arr < 0)[0])
        check_int(f"units[{i}]", int(k_arr[i]), minimum=0)
    keep = k_arr > 0
    k_arr, q = k_arr[keep].astype(np.int64), q[keep]
    if k_arr.size == 0:
        return 0, np.ones(1), 0.0
    order = np.lexsort((q, k_arr))
    k_sorted, q_sorted = k_arr[order], q[order]
    starts = np.flatnonzero(np.r_[True, (np.diff(k_sorted) != 0) | (np.diff(q_sorted) != 0)])
    counts = np.diff(np.r_[starts, k_sorted.size])
    budget = _TRUNCATION / (2 * starts.size)  # per end and factor
    offset, pmf, dropped = 0, np.ones(1), 0.0
    # Largest units first: the array grows in few, wide strides before the fine ones.
    for s, n in zip(starts[::-1], counts[::-1], strict=True):
        k, rate = int(k_sorted[s]), float(q_sorted[s])
        if n == 1:  # a single Bernoulli factor, no truncation
            pmf = _strided_convolve(pmf, np.array([1.0 - rate, rate]), k)
        else:
            factor = binomial_count(int(n), rate)
            dropped += factor.dropped_mass
            offset += k * factor.offset
            pmf = _strided_convolve(pmf, np.exp(factor.log_pmf), k)
        pmf, cut_lo, cut = _trim(pmf, budget)
        offset += cut_lo
        dropped += cut
    return offset, pmf, min(dropped, 1.0)


def _units(u: np.ndarray, resolution: int, rounding: str) -> np.ndarray:
    x = u * resolution
    # Strict rounding (no tolerance), so that "up" never moves a weight down.
    if rounding == "up":
        return np.ceil(x).astype(np.int64)
    return np.floor(x).astype(np.int64)


def _grid_pair(
    u: np.ndarray, q: np.ndarray, scale: float, resolution: int, rounding: str
) -> tuple[ShiftedGaussianMixture | None, int, float]:
    """(pair, number of grid points with positive mass, dropped mass) at one resolution."""
    offset, pmf, dropped = weighted_sum_distribution(_units(u, resolution, rounding), q)
    support = offset + np.arange(pmf.size)
    size = int(np.count_nonzero(pmf))
    if support[-1] == 0:
        return None, size, dropped  # every shift rounded to 0: P == Q
    with np.errstate(divide="ignore"):
        log_pmf = np.log(pmf)
    # The lower bound leaves the cut mass out (H(P_kept, Q) <= H(P, Q)).
    pair = ShiftedGaussianMixture(
        support / resolution, log_pmf, scale, dropped if rounding == "up" else 0.0
    )
    return pair, size, dropped


def weighted_heuristic_pair(
    *,
    weights: ArrayLike,
    sample_rates: PerStep,
    noise_multipliers: PerStep,
    resolution: int,
    rounding: str = "up",
) -> ShiftedGaussianMixture | None:
    """The rounded pair (P, Q) at a fixed ``resolution`` N (grid points per largest weight),
    in units of the largest weight; ``rounding`` is ``"up"`` (upper bound) or ``"down"``
    (lower bound). None when P == Q (no positive weight)."""
    w, q, sigma = _steps(weights, sample_rates, noise_multipliers)
    n = check_int("resolution", resolution, minimum=1)
    if rounding not in ("up", "down"):
        raise ValueError(f"`rounding` must be 'up' or 'down', got {rounding!r}.")
    if w.size == 0:
        return None
    u = w / w.max()
    return _grid_pair(u, q, math.sqrt(float(np.sum((u * sigma) ** 2))), n, rounding)[0]


def _predicted_points(u: np.ndarray, q: np.ndarray, resolution: int) -> float:
    """A cheap estimate of the grid length: resolution times the bulk of sum_t u_t B_t."""
    mean = float(np.dot(u, q))
    var = float(np.dot(u * u, q * (1.0 - q)))
    return resolution * (mean + 12.0 * math.sqrt(var) + 40.0 * float(u.max())) + 1.0


# -- public API ------------------------------------------------------------------------------


def _solve(
    quantity: str,
    argument: float,
    weights: ArrayLike,
    sample_rates: PerStep,
    noise_multipliers: PerStep,
    accuracy: float,
) -> WeightedHeuristicResult:
    acc = check_in_interval("accuracy", accuracy, 0.0, 1.0)
    w, q, sigma = _steps(weights, sample_rates, noise_multipliers)
    return solve_trusted(quantity, argument, w, q, sigma, acc)


def solve_trusted(
    quantity: str,
    argument: float,
    w: np.ndarray,
    q: np.ndarray,
    sigma: np.ndarray,
    acc: float,
) -> WeightedHeuristicResult:
    """The weighted heuristic for validated per-step arrays (weights > 0 only; sigma >= 0).
    Internal entry point of :class:`~.heuristic.LastIterateHeuristic`."""

    def result(value, lower, rel, exact, resolution, size, dropped) -> WeightedHeuristicResult:
        return WeightedHeuristicResult(
            float(value),
            float(lower),
            float(rel),
            acc,
            exact,
            resolution,
            size,
            float(dropped),
            int(w.size),
            quantity,
            argument,
        )

    if w.size == 0:
        return result(0.0, 0.0, 0.0, True, 0, 1, 0.0)
    u = w / w.max()
    if np.any(sigma == 0):  # a step released without noise (see heuristic_pair.has_noiseless_step)
        value = math.inf if quantity == "epsilon" else 1.0
        return result(value, value, 0.0, True, 0, 1, 0.0)
    if float(u.min()) >= 1.0 - _ON_GRID:
        # Constant weights: shifts rounded up to the largest weight (exact when all are equal),
        # noise of step t scaled by u_t, i.e. the constant-rate history path (what
        # LastIterateHeuristic computes for that run: the same validation, the same pair).
        scaled = sigma * u
        ends = np.flatnonzero((scaled[1:] != scaled[:-1]) | (q[1:] != q[:-1])) + 1
        history: list[TrainingSegment] = []
        for a, b in zip([0, *ends.tolist()], [*ends.tolist(), w.size], strict=True):
            append_steps(history, float(scaled[a]), float(q[a]), b - a)  # runs of equal steps
        segments = DPSGDRun.from_history(history).segments
        if quantity == "epsilon":
            value = segments_epsilon(segments, check_delta(argument))
        else:
            value = segments_delta(segments, check_epsilon(argument))
        return result(value, value, 0.0, True, 0, w.size + 1, 0.0)

    scale = math.sqrt(float(np.sum((u * sigma) ** 2)))

    def evaluate(pair: ShiftedGaussianMixture | None) -> float:
        if pair is None:
            return 0.0
        return pair.epsilon(argument) if quantity == "epsilon" else pair.delta(argument)

    resolution = _FIRST_RESOLUTION
    while True:
        upper_pair, size, dropped = _grid_pair(u, q, scale, resolution, "up")
        upper = evaluate(upper_pair)
        lower = evaluate(_grid_pair(u, q, scale, resolution, "down")[0])
        if upper > 0 and math.isfinite(upper):
            rel = max(0.0, (upper - lower) / upper)
        else:
            rel = 0.0 if upper == 0 else math.inf
        if rel <= acc or not math.isfinite(rel):
            return result(upper, lower, rel, False, resolution, size, dropped)
        # The gap shrinks about like 1 / resolution: jump to the predicted resolution.
        wanted = max(2 * resolution, math.ceil(resolution * 1.25 * rel / acc))
        wanted = min(wanted, _MAX_RESOLUTION)
        while wanted > resolution and _predicted_points(u, q, wanted) > _MAX_GRID_POINTS:
            wanted //= 2
        if wanted <= resolution:
            warn(
                f"weighted heuristic: reached relative accuracy {rel:.3g}, not the requested "
                f"{acc:g}, at the grid-size limit (resolution {resolution}); the value is "
                "still an upper bound.",
                WeightedAccuracyWarning,
            )
            return result(upper, lower, rel, False, resolution, size, dropped)
        resolution = wanted


def weighted_heuristic_epsilon_result(
    delta: float,
    *,
    weights: ArrayLike,
    sample_rates: PerStep,
    noise_multipliers: PerStep,
    accuracy: float = 1e-3,
) -> WeightedHeuristicResult:
    """Heuristic epsilon of the final model for per-step weights (module docstring), with the
    accuracy achieved.

    Args:
        delta: target delta in (0, 1).
        weights: w_1..w_T >= 0 (e.g. from :func:`~.optimizer_weights.sgd_weights`); only
            their ratios matter.
        sample_rates: q_t in (0, 1], one per step or one for all.
        noise_multipliers: sigma_t > 0, one per step or one for all.
        accuracy: requested bound on the relative over-estimate, in (0, 1).

    Returns:
        A :class:`WeightedHeuristicResult`; ``.epsilon`` is never below the exact weighted
        heuristic (the same caveat as the heuristic: exact for linear losses only).
    """
    d = check_delta(delta)
    return _solve("epsilon", d, weights, sample_rates, noise_multipliers, accuracy)


def weighted_heuristic_delta_result(
    epsilon: float,
    *,
    weights: ArrayLike,
    sample_rates: PerStep,
    noise_multipliers: PerStep,
    accuracy: float = 1e-3,
) -> WeightedHeuristicResult:
    """Heuristic delta(eps) for per-step weights, with the accuracy achieved; ``.delta`` is an
    upper bound on the exact weighted heuristic, ``relative_accuracy`` bounds its relative
    excess."""
    e = check_epsilon(epsilon)
    return _solve("delta", e, weights, sample_rates, noise_multipliers, accuracy)
