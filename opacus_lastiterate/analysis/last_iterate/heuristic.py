"""The last-iterate heuristic of Steinke et al. (ICLR 2025).

For linear losses the final model of T steps of DP-SGD (Poisson rate q, noise multiplier
sigma, add/remove neighbours) is exactly as private as distinguishing

    P = Binomial(T, q) + N(0, sigma^2 T)   from   Q = N(0, sigma^2 T),
    delta(eps) = max(H_{e^eps}(P, Q), H_{e^eps}(Q, P))

(``docs/last_iterate.md``, "Statement and threat model"; Steinke et al., "The Last Iterate
Advantage", arXiv 2410.06186).

For a history of segments (sigma_i, q_i, T_i) at a constant learning rate the count is the
Poisson-binomial sum of Binomial(T_i, q_i) and the noise variance is sum_i T_i sigma_i^2.

The number is exact for linear losses and a *heuristic* for real networks: it is not a
proven differential-privacy guarantee for deep models, and it describes the release of the
final model only. The robust form (:class:`RobustLastIterateHeuristic`, registry name
``"robust_heuristic"``) returns max over the
last t <= T steps, the value a
regulariser that zeroes the model would expose (``docs/last_iterate.md``, "Robust variant"), as a
certified upper bound (:mod:`.suffix_maximum`).

Build either by its registry name, ``privacy_model("heuristic", run)``
(:mod:`~opacus_lastiterate.analysis.privacy_models`), which picks the model of the run's
sampling scheme: these classes describe Poisson-sampled batches and refuse other runs.
"""

from __future__ import annotations

import math

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
)
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import (
    has_noiseless_step,
    segments_epsilon,
    segments_pair,
)
from opacus_lastiterate.analysis.last_iterate.suffix_maximum import certified_suffix_maximum
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    WeightedHeuristicResult,
    solve_trusted,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel, poisson_run
from opacus_lastiterate.analysis.run import (
    RunLike,
    TrainingSegment,
)

__all__ = ["LastIterateHeuristic", "RobustLastIterateHeuristic"]

def _robust_epsilon(segments: tuple[TrainingSegment, ...], delta: float) -> float:
    """Certified upper bound on max over t <= T of the heuristic epsilon of the last t steps,
    within a relative 1e-6 of an attained eps_t (:mod:`.suffix_maximum`)."""
    return certified_suffix_maximum(segments, delta).epsilon


# -- privacy models ------------------------------------------------------------------------


class LastIterateHeuristic(PrivacyModel):
    """The last-iterate heuristic of a run: ``epsilon(delta)``, ``delta(epsilon)``,
    ``beta(alpha)`` (``docs/last_iterate.md``).

    Without per-step weights this is the exact pair of the module docstring (Poisson-binomial
    count for several sample rates, noise variance sum_i T_i sigma_i^2). With weights
    (``run.weights``: learning-rate schedules, momentum) it is the weighted pair of
    :mod:`.weighted_heuristic`, rounded up to within ``accuracy`` relative. A run with a
    step without noise gives epsilon = inf and delta = 1
    (:func:`~.heuristic_pair.has_noiseless_step`).

    A heuristic: exact for linear losses, not a proven DP guarantee for deep networks; it
    describes the final model only.
    """

    kind = "heuristic"
    label = (
        "last-iterate heuristic (final model only; exact for linear losses, "
        "not a proven bound for deep networks)"
    )

    def __init__(self, run: RunLike, *, accuracy: float = 1e-3) -> None:
        self.run = poisson_run(run, model="LastIterateHeuristic", name="heuristic")
        self.accuracy = check_in_interval("accuracy", accuracy, 0.0, 1.0)

    def _weighted(self, quantity: str, argument: float) -> WeightedHeuristicResult:
        sigma, q = self.run.per_step()
        w = self.run.weights
        assert w is not None
        keep = w > 0
        return solve_trusted(quantity, argument, w[keep], q[keep], sigma[keep], self.accuracy)

    def epsilon_result(self, delta: float) -> WeightedHeuristicResult:
        """:meth:`epsilon` of a run with per-step weights, with the accuracy achieved
        (``value`` the epsilon, an upper bound; ``lower_bound`` a certified lower bound)."""
        return self._result("epsilon", check_delta(delta))

    def delta_result(self, epsilon: float) -> WeightedHeuristicResult:
        """:meth:`delta` of a run with per-step weights, with the accuracy achieved."""
        return self._result("delta", check_epsilon(epsilon))

    def _result(self, quantity: str, argument: float) -> WeightedHeuristicResult:
        if self.run.weights is None:
            raise ValueError("`run` has no per-step weights: epsilon and delta are exact here.")
        if self.run.has_zero_noise:
            raise ValueError("`run` has a step without noise: epsilon is inf, delta 1.")
        return self._weighted(quantity, argument)

    def _epsilon(self, delta: float) -> float:
        """Never below the exact epsilon of the pair."""
        if self.run.weights is not None:
            return float(self._weighted("epsilon", delta).value)
        return segments_epsilon(self.run.segments, delta)

    def _delta(self, epsilon: float) -> float:
        """An upper bound on the exact delta of the pair."""
        if self.run.weights is not None:
            return float(self._weighted("delta", epsilon).value)
        pair = segments_pair(self.run.segments)
        return 0.0 if pair is None else pair.delta(epsilon)

    def beta(self, alpha: float) -> float:
        """Trade-off curve T(P, Q)(alpha): the smallest false-negative rate of a test that says
        "canary present" with false-positive rate ``alpha`` in [0, 1] (a lower bound; the
        constant-rate pair only)."""
        a = check_in_interval("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
        if self.run.weights is not None:
            raise NotImplementedError(
                "beta(alpha) is computed for runs without per-step weights only."
            )
        if has_noiseless_step(self.run.segments):
            return 0.0 if a > 0 else 1.0
        pair = segments_pair(self.run.segments)
        return 1.0 - a if pair is None else pair.beta(a)

    def __repr__(self) -> str:
        return f"LastIterateHeuristic(steps={self.run.num_steps}, segments={len(self.run.segments)})"


class RobustLastIterateHeuristic(PrivacyModel):
    """max over t <= T of the heuristic of the last t steps (``docs/last_iterate.md``,
    "Robust variant"): what a regulariser that zeroes the model would expose. Runs without
    per-step weights only."""

    kind = "heuristic"
    label = "robust last-iterate heuristic: max over the last t <= T steps"

    def __init__(self, run: RunLike) -> None:
        self.run = poisson_run(run, model="RobustLastIterateHeuristic", name="robust_heuristic")
        if self.run.weights is not None:
            raise ValueError(
                "`run` must have no per-step weights: the robust maximum is computed for the "
                "constant-rate formula."
            )

    def _epsilon(self, delta: float) -> float:
        """max_t eps_t(delta), an upper bound on the exact maximum."""
        return _robust_epsilon(self.run.segments, delta)

    def _delta(self, epsilon: float) -> float:
        """max_t delta_t(epsilon): the smallest delta whose robust epsilon is <= ``epsilon``,
        by bisection on log delta (to 1e-6 relative, rounded up)."""
        e = epsilon
        if self.epsilon(1.0 - 1e-15) > e:
            return 1.0
        lo, hi = math.log(1e-300), math.log(1.0 - 1e-15)  # eps(lo) > e >= eps(hi)
        if self.epsilon(math.exp(lo)) <= e:
            return math.exp(lo)
        while hi - lo > 1e-6:
            mid = 0.5 * (lo + hi)
            if self.epsilon(math.exp(mid)) <= e:
                hi = mid
            else:
                lo = mid
        return math.exp(hi)

    def __repr__(self) -> str:
        return f"RobustLastIterateHeuristic(steps={self.run.num_steps})"
