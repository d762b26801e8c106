"""The last-iterate accountant's check that the heuristic is monotone in the number of steps.

The heuristic eps_T of T steps can be smaller than the eps_t of its last t < T steps alone
(``docs/last_iterate.md``, "Robust variant"); a regulariser that zeroes the model would then
expose the larger value. :class:`MonotonicityWatch` warns once per delta
(:class:`~opacus_lastiterate.exceptions.NonMonotoneHeuristicWarning`) when that happens,
without stalling a training step:

* a run with one (sigma, q) (the common case): every suffix is such a run, the values
  computed at earlier steps are the suffix values, and a sweep evaluates at most two more t
  per query (every t <= 1024, then a 1% geometric grid) below the first step at which epsilon
  was asked for; a batch of steps solved together is checked in one pass;
* several segments: a certified search over all suffixes of the history as it was when the
  check started (again each time the number of steps has doubled), spread over queries with
  at most about 5 ms of work each; a batch of steps solved together starts the searches its
  steps' queries would have started, each from the run at its step, with the work of that
  many queries.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import segments_epsilon
from opacus_lastiterate.analysis.last_iterate.suffix_maximum import (
    SuffixMaximum,
    suffix_maximum_search,
)
from opacus_lastiterate.analysis.run import TrainingSegment, prefix
from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning

__all__ = []

_CHECK_SECONDS_PER_CALL = 0.005  # work per query for the multi-segment check


class _Sweep:
    """The t at which the check evaluates eps_t below the first step at which epsilon was
    asked: every t <= 1024, then a geometric grid of ratio 1.01."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._next = 1
        self.best, self.best_steps = -math.inf, 0

    def advance(self, count: int) -> Iterator[int]:
        for _ in range(count):
            t = self._next
            if t >= self.limit:
                return
            self._next = t + 1 if t < 1024 else max(t + 1, round(t * 1.01))
            yield t

    @property
    def exhausted(self) -> bool:
        """Whether every t below the limit has been evaluated."""
        return self._next >= self.limit

    def record(self, steps: int, value: float) -> None:
        if value > self.best:
            self.best, self.best_steps = value, steps


class MonotonicityWatch:
    """Warns once per delta when eps_T falls below the epsilon of a shorter suffix (module
    docs). The accountant calls :meth:`after_query` after each plain query and
    :meth:`batch_sweep` / :meth:`check` around a batch of steps solved together."""

    def __init__(self) -> None:
        self.warned: set[float] = set()
        self._sweeps: dict[float, _Sweep] = {}
        self._full_checks: dict[float, tuple[Generator[None, None, SuffixMaximum], int, float]] = {}
        self._full_checked: dict[float, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles drop a pending multi-segment check (a generator); it restarts."""
        state = self.__dict__.copy()
        state["_full_checks"] = {}
        return state

    def after_query(
        self,
        delta: float,
        eps: float,
        segments: Sequence[TrainingSegment],
        num_steps: int,
        engine: Any,
    ) -> None:
        """The check after ``eps`` = eps_T was answered for ``segments`` (T = ``num_steps``)
        by the incremental ``engine`` (its ``suffix_peak``: the largest value it computed)."""
        if delta in self.warned:
            return
        if len(segments) != 1:
            self._advance_full_check(delta, eps, segments, num_steps)
            return
        seg = segments[0]
        sweep = self._sweeps.get(delta)
        if sweep is None:
            sweep = self._sweeps[delta] = _Sweep(limit=num_steps)
        for t in sweep.advance(2):
            prefix = TrainingSegment._trusted(seg.noise_multiplier, seg.sample_rate, t)
            sweep.record(t, segments_epsilon((prefix,), delta))
        peak = engine.suffix_peak(delta)
        self.check(delta, np.array([eps]), num_steps, peak, sweep)

    def batch_sweep(
        self,
        delta: float,
        segments: Sequence[TrainingSegment],
        sigma: float,
        q: float,
        num_steps: int,
    ) -> tuple[bool, _Sweep | None]:
        """Whether steps at (sigma, q) after ``segments`` can be solved together (the
        single-segment check with nothing left to sweep, or no check left), and the sweep
        to :meth:`check` them against (None: no check left)."""
        if delta in self.warned:
            return True, None
        if segments and not (
            len(segments) == 1
            and segments[0].noise_multiplier == sigma
            and segments[0].sample_rate == q
        ):
            return False, None  # several segments: the spread-out search of every query
        sweep = self._sweeps.get(delta)
        if sweep is None:  # as the first query makes it
            sweep = self._sweeps[delta] = _Sweep(limit=num_steps + 1)
        return sweep.exhausted, sweep

    def check(
        self, delta: float, eps: np.ndarray, first: int, peak: Any, sweep: _Sweep
    ) -> None:
        """Warn at the first of ``eps`` (the values after steps ``first``, ``first`` + 1,
        ...) below the largest value of a shorter suffix: an earlier one of ``eps``, the
        engine's ``peak`` before them or the ``sweep``'s best."""
        best = np.maximum.accumulate(eps)
        if peak is not None:
            best = np.maximum(best, peak.epsilon)
        best = np.maximum(best, sweep.best)
        low = np.flatnonzero(eps < best * (1.0 - 1e-9))
        if not low.size:
            return
        j = int(low[0])
        top = int(np.argmax(eps[: j + 1]))
        best_t, value = first + top, float(eps[top])
        if peak is not None and peak.epsilon >= value:
            best_t, value = peak.steps, peak.epsilon
        if sweep.best > value:
            best_t, value = sweep.best_steps, sweep.best
        self._warn(delta, float(eps[j]), first + j, best_t, value)

    def _warn(self, delta: float, eps: float, steps: int, best_t: int, best: float) -> None:
        self.warned.add(delta)
        warn(
            f"The last-iterate heuristic is not monotone here: eps_T = {eps:.4f} after "
            f"T = {steps} steps, but the last {best_t} steps alone give {best:.4f}. A "
            "regulariser that zeroes the model would expose the larger value; report "
            "get_epsilon(delta, robust=True) beside it.",
            NonMonotoneHeuristicWarning,
        )

    def _advance_full_check(
        self, delta: float, eps: float, segments: Sequence[TrainingSegment], num_steps: int
    ) -> None:
        """The check for histories of several segments (module docs)."""
        if self._full_checks.get(delta) is None:
            if num_steps < 2 * self._full_checked.get(delta, 0):
                return
            self._start(delta, tuple(segments), num_steps, eps)
        self._work(delta, time.perf_counter() + _CHECK_SECONDS_PER_CALL)

    def after_batch(
        self, delta: float, eps: np.ndarray, segments: Sequence[TrainingSegment],
        num_steps: int,
    ) -> None:
        """The multi-segment check after a batch of steps solved together (``eps``: the
        values after its steps, the last being ``num_steps``): the searches that queries
        after each step would have started (at the first step with two segments, then each
        time the steps have doubled since the last completed one), each from the run as it
        was at its step, with the work of that many queries in all."""
        if delta in self.warned:
            return
        first = num_steps - len(eps) + 1
        two_segments = segments[0].steps + 1 if segments else num_steps + 1
        deadline = time.perf_counter() + len(eps) * _CHECK_SECONDS_PER_CALL
        t = first
        while t <= num_steps and delta not in self.warned:
            if self._full_checks.get(delta) is None:
                t = max(t, two_segments, 2 * self._full_checked.get(delta, 0))
                if t > num_steps:
                    return
                self._start(delta, prefix(segments, t), t, float(eps[t - first]))
            if not self._work(delta, deadline):
                return  # the search goes on at the next queries
            t += 1

    def _start(
        self, delta: float, segments: tuple[TrainingSegment, ...], steps: int, eps: float
    ) -> None:
        """Start the certified search over every suffix of ``segments`` (``steps`` steps,
        whose heuristic is ``eps``)."""
        self._full_checks[delta] = (suffix_maximum_search(segments, delta), steps, eps)

    def _work(self, delta: float, deadline: float) -> bool:
        """Advance the pending search until ``deadline``; whether it ended (then warn if
        the value it started from is below the maximum it found)."""
        search, steps, eps_then = self._full_checks[delta]
        while time.perf_counter() < deadline:
            try:
                next(search)
            except StopIteration as done:
                del self._full_checks[delta]
                self._full_checked[delta] = steps
                peak = done.value
                if eps_then < peak.attained * (1.0 - 1e-9):
                    self._warn(delta, eps_then, steps, peak.argmax_steps, peak.attained)
                return True
        return False
