"""Per-step accounting of the last-iterate heuristic for a run that grows one step at a time.

An accountant asked for epsilon after every training step must not recompute from scratch
(``docs/run_description.md``, "Per-step accounting"). :class:`IncrementalHeuristic` keeps,
between steps:

* the run in its Opacus form (segments, run-length merged), the steps per sample rate and the
  noise variance sum_i T_i sigma_i^2, updated in O(1) per step;
* the count distribution of the sample rates that no longer change (a Poisson-binomial law,
  convolved once; a rate left behind is convolved into it when the rate changes, so a rate
  that changes at every step costs one convolution a step), so that a step convolves only
  the current rate's binomial into it, and that binomial is updated from the last step's
  (:class:`~.canary_count.BinomialSequence`);
* per delta, the thresholds (y0, y_PQ, y_QP) of the last solve, which warm-start the root
  finding of the next step (same tolerance, fewer Newton steps);
* :meth:`IncrementalHeuristic.advance` records many steps at one (sigma, q) and returns the
  epsilon after each, solving their pairs together (:mod:`.gaussian_mixture_stack`) when
  every step of the run has that sample rate (one Binomial count per step);
* per delta, the largest epsilon of a suffix inside the current segment seen so far, so that
  the non-monotonicity check (eps_T < max_{t <= T} eps_t) costs nothing extra per step: a
  suffix of t steps inside the last segment is t steps at that segment's (sigma, q), whose
  epsilon does not depend on what came before. Suffixes that cross segments are checked in
  full by the certified search (:class:`~.heuristic.RobustLastIterateHeuristic`) on demand.

Values equal the from-scratch computation of :class:`~.heuristic.LastIterateHeuristic` to
the root finder's tolerance (a test compares them step by step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    BinomialSequence,
    CountDistribution,
    _window,
    binomial_count,
    binomial_count_stack,
    convolve_counts,
    poisson_binomial_count,
)
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture_stack import MixtureStack
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment, runs_of

__all__ = [
    "IncrementalHeuristic",
]

STACK_MAX_POINTS = 500
"""Largest count window (points of Binomial(T, q) kept) at which :meth:`IncrementalHeuristic.advance`
solves steps together: beyond it the work per point outweighs the calls saved, and the
step-by-step path (whose warm starts land at once at large T) is faster
(``benchmarks/bench_batched_heuristic.py``)."""

Hints = tuple[float, float, float]


@dataclass(frozen=True)
class SuffixPeak:
    """The largest epsilon of a suffix of the current segment evaluated so far."""

    epsilon: float
    steps: int


class IncrementalHeuristic:
    """The heuristic epsilon of a growing run, updated step by step (module docstring).

    Inputs to :meth:`append` are trusted (the accountant validates them at its boundary).
    """

    def __init__(self) -> None:
        self._segments: list[TrainingSegment] = []
        self._steps = 0
        self._zero_noise_steps = 0
        self._variance = 0.0
        self._steps_by_rate: dict[float, int] = {}
        self._frozen: CountDistribution | None = None  # rates other than the current one
        self._frozen_rates: frozenset[float] = frozenset()
        self._binomials: tuple[float, BinomialSequence] | None = None  # the current rate's
        self._pair_key: int = -1
        self._pair: ShiftedGaussianMixture | None = None
        # per delta: (steps, thresholds, the entry before) of the last two solves
        self._hints: dict[float, tuple[int, Hints, tuple | None]] = {}
        self._epsilons: dict[float, tuple[int, float]] = {}
        self._peaks: dict[float, SuffixPeak] = {}
        self._run: DPSGDRun | None = None

    # -- the run --------------------------------------------------------------------------

    @classmethod
    def from_run(cls, run: DPSGDRun) -> IncrementalHeuristic:
        """State for an existing run (e.g. a loaded checkpoint)."""
        state = cls()
        for seg in run.segments:
            state.append(seg.noise_multiplier, seg.sample_rate, seg.steps)
        return state

    def append(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` more steps at (sigma, q); merges with the last segment if equal."""
        if steps <= 0:
            return
        last = self._segments[-1] if self._segments else None
        if last is not None and last.noise_multiplier == noise_multiplier and last.sample_rate == sample_rate:
            self._segments[-1] = TrainingSegment._trusted(
                noise_multiplier, sample_rate, last.steps + steps
            )
        else:
            self._segments.append(TrainingSegment._trusted(noise_multiplier, sample_rate, steps))
            self._peaks.clear()  # a new segment: its suffixes start afresh
        self._steps += steps
        self._variance += steps * noise_multiplier * noise_multiplier
        if noise_multiplier == 0.0:
            self._zero_noise_steps += steps
        self._steps_by_rate[sample_rate] = self._steps_by_rate.get(sample_rate, 0) + steps
        if sample_rate in self._frozen_rates:  # an old rate came back: rebuild the frozen part
            self._frozen, self._frozen_rates = None, frozenset()
        self._run = None

    @property
    def num_steps(self) -> int:
        """T, the number of steps recorded."""
        return self._steps

    @property
    def segments(self) -> tuple[TrainingSegment, ...]:
        """The recorded segments, oldest first."""
        return tuple(self._segments)

    @property
    def run(self) -> DPSGDRun:
        """The recorded run as a :class:`DPSGDRun` (built once per change)."""
        if self._run is None:
            self._run = DPSGDRun._trusted(tuple(self._segments))
        return self._run

    @property
    def noiseless(self) -> bool:
        """Some recorded step had no noise: epsilon = inf (:func:`.heuristic_pair.has_noiseless_step`)."""
        return self._zero_noise_steps > 0

    # -- the pair ---------------------------------------------------------------------------

    def _count(self) -> CountDistribution:
        current = self._segments[-1].sample_rate
        if self._binomials is None or self._binomials[0] != current:
            self._binomials = (current, BinomialSequence(current))
        current_count = self._binomials[1].count(self._steps_by_rate[current])
        others = frozenset(self._steps_by_rate) - {current}
        if not others:
            return current_count
        if self._frozen is not None and self._frozen_rates < others:
            # rates left behind since: their step counts are final (a rate that comes back
            # clears the frozen part), so each is convolved in once
            for q in sorted(others - self._frozen_rates):
                self._frozen = convolve_counts(
                    self._frozen, binomial_count(self._steps_by_rate[q], q)
                )
            self._frozen_rates = others
        elif self._frozen is None or self._frozen_rates != others:
            self._frozen = poisson_binomial_count(
                [(self._steps_by_rate[q], q) for q in sorted(others)]
            )
            self._frozen_rates = others
        return convolve_counts(self._frozen, current_count)

    def pair(self) -> ShiftedGaussianMixture | None:
        """The (P, Q) pair of the recorded run (None when no step was recorded)."""
        if self._pair_key != self._steps:
            if self._steps == 0 or self._variance == 0.0:
                self._pair = None
            else:
                self._pair = count_pair(self._count(), self._variance)
            self._pair_key = self._steps
        return self._pair

    # -- queries ----------------------------------------------------------------------------

    def epsilon(self, delta: float) -> float:
        """Heuristic epsilon of the recorded run at (validated) ``delta``; cached per step."""
        cached = self._epsilons.get(delta)
        if cached is not None and cached[0] == self._steps:
            return cached[1]
        if self._steps == 0:
            eps = 0.0
        elif self.noiseless:
            eps = math.inf
        else:
            pair = self.pair()
            assert pair is not None
            try:
                eps, hints = pair.epsilon_warm(delta, self._predicted_hints(delta))
            except ArithmeticError:  # a warm start must never cost a step: solve cold
                eps, hints = pair.epsilon_warm(delta, None)
            if all(math.isfinite(h) for h in hints):
                last = self._hints.get(delta)
                previous = None if last is None else (last[0], last[1], None)
                self._hints[delta] = (self._steps, hints, previous)
        self._epsilons[delta] = (self._steps, eps)
        if len(self._segments) == 1:
            # t steps of the only segment: a suffix of every later T in this segment
            peak = self._peaks.get(delta)
            if peak is None or eps > peak.epsilon:
                self._peaks[delta] = SuffixPeak(eps, self._steps)
        return eps

    def advance(
        self, noise_multiplier: float | np.ndarray, sample_rate: float, steps: int, delta: float
    ) -> np.ndarray:
        """Record ``steps`` more steps at (sigma, q) (``noise_multiplier``: one sigma, or one
        per step) and return the epsilon at ``delta`` after each of them: the values that
        :meth:`append` and :meth:`epsilon` step by step give, to the root finder's tolerance.
        When every recorded step has rate q (< 1), sigma > 0 and the count window stays
        below :data:`STACK_MAX_POINTS`, the pairs of the new steps are solved together
        (module docstring; a noise schedule only changes each pair's Gaussian)."""
        sigmas = np.broadcast_to(np.asarray(noise_multiplier, dtype=float), (steps,))
        out = np.empty(steps)
        done = 0
        lo, hi = _window(self._steps + steps, sample_rate)
        stackable = (
            steps > 0
            and float(sigmas.min()) > 0.0
            and sample_rate < 1.0
            and not self.noiseless
            and set(self._steps_by_rate) <= {sample_rate}
            and hi - lo < STACK_MAX_POINTS
        )
        # the first two steps of a run go one by one: the stack needs two solves to start from
        while done < steps and (not stackable or self._two_solves(delta) is None):
            self.append(float(sigmas[done]), sample_rate)
            out[done] = self.epsilon(delta)
            done += 1
        if done < steps:
            out[done:] = self._stack_epsilons(sigmas[done:], sample_rate, delta)
        return out

    def _append_each(self, sigmas: np.ndarray, sample_rate: float) -> None:
        """Record one step per entry of ``sigmas`` (runs of one sigma at once)."""
        for sigma, steps in runs_of(sigmas):
            self.append(sigma, sample_rate, steps)

    def _two_solves(self, delta: float) -> tuple[int, Hints, int, Hints] | None:
        """(t0, thresholds at t0, t1, thresholds at t1) of the last two solves, t1 = T."""
        last = self._hints.get(delta)
        if last is None or last[0] != self._steps or last[2] is None:
            return None
        t1, h1, (t0, h0, _) = last  # type: ignore[misc]
        return (t0, h0, t1, h1) if t0 < t1 else None

    def _stack_epsilons(self, sigmas: np.ndarray, sample_rate: float, delta: float) -> np.ndarray:
        """The stacked path of :meth:`advance` (its conditions hold, two solves known).

        Thresholds are smooth in T, but a straight line through the last two solves drifts
        over a long batch; so three anchor steps (a third of the way, two thirds, the last)
        are solved first, from that line, and every other step starts from the cubic through
        the last solve and the anchors. If an anchor needs the one-pair path, so would most
        steps: the batch then goes step by step."""
        t0, h0, t1, h1 = self._two_solves(delta)  # type: ignore[misc]
        steps = sigmas.size
        lanes = self._steps + np.arange(1, steps + 1)
        if sigmas[0] == sigmas[-1] and np.all(sigmas == sigmas[0]):
            variances = self._variance + np.arange(1, steps + 1) * (float(sigmas[0]) ** 2)
        else:
            variances = self._variance + np.cumsum(sigmas * sigmas)
        offset, log_pmf, dropped = binomial_count_stack(lanes, sample_rate)
        stack = MixtureStack(offset, log_pmf, np.sqrt(variances), dropped)
        ratio = (lanes - t1) / (t1 - t0)
        hints = np.array([b + ratio * (b - a) for a, b in zip(h0, h1, strict=True)])
        anchors = (
            np.unique([steps // 3, (2 * steps) // 3, steps - 1]) if steps >= 12 else np.arange(0)
        )
        if anchors.size:
            first = stack.select(anchors).epsilons(delta, hints[1, anchors], hints[2, anchors])
            if not first.solved.all():
                return self._one_by_one(sigmas, sample_rate, delta)
            known_t = np.concatenate(([t1], lanes[anchors]))
            for row, roots in ((1, first.y_pq), (2, first.y_qp)):
                hints[row] = _polynomial(known_t, np.concatenate(([h1[row]], roots)), lanes)
            hints[1, anchors], hints[2, anchors] = first.y_pq, first.y_qp
        solution = stack.epsilons(delta, hints[1], hints[2])
        eps, y_pq, y_qp = solution.epsilon, solution.y_pq, solution.y_qp
        for j in np.flatnonzero(~solution.solved):  # solved alone, as :meth:`epsilon` does
            pair = count_pair(binomial_count(int(lanes[j]), sample_rate), float(variances[j]))
            hint = (float(hints[0, j]), float(hints[1, j]), float(hints[2, j]))
            try:
                value, alone = pair.epsilon_warm(delta, hint)
            except ArithmeticError:
                value, alone = pair.epsilon_warm(delta, None)
            eps[j], y_pq[j], y_qp[j] = value, alone[1], alone[2]
        self._append_each(sigmas, sample_rate)

        def thresholds(j: int) -> Hints:
            return float(hints[0, j]), float(y_pq[j]), float(y_qp[j])

        final = thresholds(-1)
        before = (int(lanes[-2]), thresholds(-2), None) if steps >= 2 else None
        if all(math.isfinite(h) for h in final):
            self._hints[delta] = (self._steps, final, before)
        self._epsilons[delta] = (self._steps, float(eps[-1]))
        if len(self._segments) == 1:
            top = int(np.argmax(eps))
            peak = self._peaks.get(delta)
            if peak is None or eps[top] > peak.epsilon:
                self._peaks[delta] = SuffixPeak(float(eps[top]), int(lanes[top]))
        return eps

    def _one_by_one(self, sigmas: np.ndarray, sample_rate: float, delta: float) -> np.ndarray:
        out = np.empty(sigmas.size)
        for j, sigma in enumerate(sigmas.tolist()):
            self.append(sigma, sample_rate)
            out[j] = self.epsilon(delta)
        return out

    def _predicted_hints(self, delta: float) -> Hints | None:
        """Thresholds of this step, extrapolated linearly in T from the last two solves."""
        last = self._hints.get(delta)
        if last is None:
            return None
        t1, h1, before = last
        if before is None or before[0] >= t1 or t1 >= self._steps:
            return h1
        t0, h0 = before[0], before[1]
        r = (self._steps - t1) / (t1 - t0)
        return tuple(b + r * (b - a) for a, b in zip(h0, h1, strict=True))  # type: ignore[return-value]

    def delta(self, epsilon: float) -> float:
        """Heuristic delta(epsilon) of the recorded run at (validated) ``epsilon``."""
        if self._steps == 0:
            return 0.0
        if self.noiseless:
            return 1.0
        pair = self.pair()
        assert pair is not None
        return pair.delta(epsilon)

    def suffix_peak(self, delta: float) -> SuffixPeak | None:
        """The largest eps_t seen for t steps of the current (single) segment, if any."""
        return self._peaks.get(delta)


def _polynomial(t: np.ndarray, h: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The polynomial of degree len(t) - 1 through the points (t_i, h_i), evaluated at
    ``at`` (Lagrange form)."""
    out = np.zeros(at.size)
    for i in range(t.size):
        basis = np.ones(at.size)
        for j in range(t.size):
            if j != i:
                basis *= (at - t[j]) / (t[i] - t[j])
        out += h[i] * basis
    return out
