"""Per-step accounting of the last-iterate heuristic for a run that grows one step at a time.

An accountant asked for epsilon after every training step must not recompute from scratch
(``docs/run_description.md``, "Per-step accounting"). :class:`IncrementalHeuristic` keeps,
between steps:

* the run in its Opacus form (segments, run-length merged), the steps per sample rate and the
  noise variance sum_i T_i sigma_i^2, updated in O(1) per step;
* the count distribution of the sample rates that no longer change (a Poisson-binomial law,
  convolved once), so that a step convolves only the current rate's binomial into it, and
  that binomial is updated from the last step's (:class:`~.canary_count.BinomialSequence`);
* per delta, the thresholds (y0, y_PQ, y_QP) of the last solve, which warm-start the root
  finding of the next step (same tolerance, fewer Newton steps);
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

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    BinomialSequence,
    CountDistribution,
    convolve_counts,
    poisson_binomial_count,
)
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.heuristic import count_pair
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment

__all__ = ["IncrementalHeuristic", "SuffixPeak"]

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
        """Some recorded step had no noise: epsilon = inf (``heuristic._noiseless``)."""
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
        if self._frozen is None or self._frozen_rates != others:
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
