"""Composition of Poisson-subsampled Gaussian steps as PLD arrays: what dp_accounting's PLD
composition computes for a run, without its per-call overheads (``docs/last_iterate.md``,
"Baselines").

For each segment (sigma, q, T), oldest first, the one-step (remove, add) PMFs of
:func:`~.subsampled_gaussian_pld.subsampled_gaussian_pmfs` are self-composed T times with
dp_accounting's ``self_convolve`` (Chernoff-bounded window, tail mass
``tail_mass_truncation`` added to the mass at infinity; skipped for T = 1) and composed
into the running PMF by FFT convolution, whose tails of mass up to
``tail_mass_truncation / 2`` each are truncated pessimistically (left tail onto the first
kept point, right tail to infinity): the operations of dp_accounting's ``DensePLDPmf``
``self_compose`` and ``compose``, on arrays. Every step keeps the PLD pessimistic, so the
result is an upper bound on the exact composition (it differs from dp_accounting's own
composition only by one skipped truncation per one-step segment, which makes it tighter by
at most ``tail_mass_truncation`` in delta per such segment). :class:`PLDComposer` keeps the
running PMFs, so that a growing run adds one convolution per new segment.

Two things make a noise multiplier that changes at every step affordable:

* :func:`group_noise` merges consecutive segments with the same sample rate whose noise
  multipliers lie within a factor ``1 + noise_grouping`` of each other into one segment at
  the smallest of them. Less noise at the same rate can only lose privacy (the mechanism
  with the larger noise multiplier is the one with the smaller followed by independent
  extra Gaussian noise, a post-processing), so the composition of the merged run is an
  upper bound on that of the run. The groups are formed greedily from the first step, so
  the groups of a prefix of a run are those of the run, except that the last may grow.
* :class:`CompositionCache` keeps the composer after the last run it composed, and after
  all of that run's segments but the last: a run that extends it (new segments, or more
  steps of its last one) composes only what is new, with the same floating-point
  operations as a composition from scratch, so the result is the same float.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import NDArray
from scipy import signal

from opacus_lastiterate.analysis.baselines.self_convolution import clear_transforms, self_convolve
from opacus_lastiterate.analysis.baselines.subsampled_gaussian_pld import (
    LossPmf,
    loss_range,
    subsampled_gaussian_pmfs,
)

__all__ = []

TAIL_MASS_TRUNCATION = 1e-15
"""dp_accounting's default ``tail_mass_truncation`` of ``compose`` and ``self_compose``."""

GRID_POINTS = 8192
"""The most points the least private one-step PLD spans in a composition whose work
:func:`bounded_groups` bounds."""

FREE_GROUPS = 16
"""Runs of at most this many groups are composed at the requested interval whatever their
grid (a few noise milestones cost a few one-step PLDs)."""

WORK_POINTS = 2**20
"""The grid points (groups times the least private group's span) above which
:func:`bounded_groups` widens the interval."""


def compose_subsampled_gaussian(
    history: Iterable[tuple[float, float, int]],
    value_discretization_interval: float,
    tail_mass_truncation: float = TAIL_MASS_TRUNCATION,
) -> PrivacyLossDistribution:
    """The pessimistic PLD of the run ``[(sigma > 0, q, steps), ...]`` (module docstring),
    as a dp_accounting ``PrivacyLossDistribution``."""
    composer = PLDComposer(value_discretization_interval, tail_mass_truncation)
    for sigma, q, steps in history:
        composer.add(sigma, q, steps)
    return composer.pld()


def group_noise(
    history: Iterable[tuple[float, float, int]], noise_grouping: float
) -> list[tuple[float, float, int]]:
    """The run ``[(sigma > 0, q, steps), ...]`` with consecutive segments of the same ``q``
    whose noise multipliers lie within a factor ``1 + noise_grouping`` of each other (the
    largest over the smallest of the group) merged into one segment at the smallest
    (module docstring: its composition is an upper bound on the run's). Segments without
    steps are dropped; ``noise_grouping = 0`` merges only equal noise multipliers."""
    return [(sigma, q, steps) for sigma, q, steps, _ in _grouped(history, noise_grouping)]


def _grouped(
    history: Iterable[tuple[float, float, int]], noise_grouping: float, rates: bool = False
) -> list[tuple[float, float, int, bool]]:
    """:func:`group_noise`, each group with whether it merged distinct settings. With
    ``rates``, sample rates within the same factor merge too, at the largest of them (the
    pair of a smaller Poisson rate is a mixture of the larger rate's pair with the
    identical pair (Q, Q), and hockey-stick divergences are jointly convex, so the larger
    rate's pair dominates)."""
    out: list[tuple[float, float, int, bool]] = []
    low = high = q_low = q_high = 0.0
    limit = 1.0 + noise_grouping
    for sigma, q, steps in history:
        if steps <= 0:
            continue
        if out:
            lo, hi = min(low, sigma), max(high, sigma)
            q_lo, q_hi = min(q_low, q), max(q_high, q)
            if hi <= lo * limit and (q_lo == q_hi or (rates and q_hi <= q_lo * limit)):
                low, high, q_low, q_high = lo, hi, q_lo, q_hi
                out[-1] = (lo, q_hi, out[-1][2] + steps, lo != hi or q_lo != q_hi)
                continue
        low = high = sigma
        q_low = q_high = q
        out.append((sigma, q, steps, False))
    return out


def bounded_groups(
    history: Sequence[tuple[float, float, int]], value_discretization_interval: float,
    noise_grouping: float, max_groups: int,
) -> tuple[list[tuple[float, float, int, bool]], float, float]:
    """(groups, interval, grouping) that bound the work of a composition: at most
    ``max_groups`` one-step PLDs, on grids of at most :data:`WORK_POINTS` points in all.

    A run whose :func:`group_noise` at ``noise_grouping`` has at most ``max_groups`` groups,
    and at most :data:`FREE_GROUPS` of them or at most :data:`WORK_POINTS` grid points in
    all (counted at the least private group's span), is returned as it is: the requested
    interval and grouping. Otherwise, with more than ``max_groups`` groups, the grouping
    widens to at least ``spread ** (1 / max_groups) - 1`` (the spread of the run's noise
    multipliers and sample rates; doubled until at most ``max_groups`` groups remain: a
    monotone schedule needs no second pass) and sample rates merge too (each group at its
    smallest noise multiplier and largest sample rate); and the interval widens so that the
    least private group's one-step PLD spans at most :data:`GRID_POINTS` points
    (connect-the-dots discretisation is pessimistic on any grid, and loses little at this
    resolution). Both are rounded up to a rung of a fixed ladder (:func:`_ladder`: factors
    of sqrt(2) above ``noise_grouping`` and of 2 above the requested interval), so that a
    run that grows keeps them, and its kept composition, until it needs the next rung. Each
    step is then composed with its noise multiplier lowered and its sample rate raised by
    at most the factor 1 + grouping: an upper bound on the run, whatever its number of
    segments."""
    groups = _grouped(history, noise_grouping)
    if len(groups) <= min(max_groups, FREE_GROUPS):
        return groups, value_discretization_interval, noise_grouping
    span = loss_range(min(g[0] for g in groups), max(g[1] for g in groups))
    if len(groups) <= max_groups and (
        len(groups) * span / value_discretization_interval <= WORK_POINTS
    ):
        return groups, value_discretization_interval, noise_grouping
    grouping = noise_grouping
    if len(groups) > max_groups:
        sigmas = [sigma for sigma, _, steps in history if steps > 0]
        rates = [q for _, q, steps in history if steps > 0]
        spread = max(max(sigmas) / min(sigmas), max(rates) / min(rates))
        base = noise_grouping if noise_grouping > 0 else 2.0**-10
        grouping = _ladder(max(noise_grouping, spread ** (1.0 / max_groups) - 1.0), base, 0.5)
        while True:
            groups = _grouped(history, grouping, rates=True)
            if len(groups) <= max_groups or grouping >= spread - 1.0:
                break
            grouping = _ladder(2.0 * grouping, base, 0.5)
        span = loss_range(min(g[0] for g in groups), max(g[1] for g in groups))
    interval = _ladder(float(span) / GRID_POINTS, value_discretization_interval, 1.0)
    return groups, interval, grouping


def _ladder(value: float, base: float, step: float) -> float:
    """The smallest ``base * 2 ** (k * step)``, k = 0, 1, ..., at least ``value``: the same
    float for every value between two rungs, so that a growing run keeps its grouping and
    interval (and its kept composition) until it needs the next rung."""
    if value <= base:
        return base
    k = math.ceil(math.log2(value / base) / step - 1e-9)
    while base * 2.0 ** (k * step) < value:
        k += 1
    return base * 2.0 ** (k * step)


class PLDComposer:
    """The composition of :func:`compose_subsampled_gaussian`, added to one segment at a
    time: a growing run costs one one-step build and one convolution per new segment, not a
    recomputation (trusted inputs: sigma > 0, q in (0, 1], steps >= 0).

    With ``squaring=True`` a segment of several steps is self-composed by repeated squaring
    with the truncating composition (about log2(steps) convolutions, each truncated
    pessimistically, so the mass at infinity may grow by ``tail_mass_truncation`` per
    convolution) instead of dp_accounting's ``self_convolve`` (one FFT power over a window
    that it does not truncate): a few times faster for tens to hundreds of steps, and a
    narrower PMF to compose next. Still an upper bound; not dp_accounting's float.
    """

    def __init__(
        self, value_discretization_interval: float,
        tail_mass_truncation: float = TAIL_MASS_TRUNCATION, squaring: bool = False,
    ) -> None:
        self.interval = value_discretization_interval
        self.tail = tail_mass_truncation
        self.squaring = squaring
        self._remove = self._add = LossPmf(0, np.ones(1), 0.0)
        self._symmetric = True

    def copy(self) -> PLDComposer:
        """An independent composer with the same steps (the PMF arrays are never modified in
        place, so they are shared)."""
        out = PLDComposer(self.interval, self.tail, self.squaring)
        out._remove, out._add, out._symmetric = self._remove, self._add, self._symmetric
        return out

    def add(
        self, noise_multiplier: float, sample_rate: float, steps: int = 1,
        squaring: bool | None = None,
    ) -> None:
        """Compose ``steps`` more steps at (sigma, q), self-composed by squaring if
        ``squaring`` (None: the composer's ``squaring``)."""
        if steps <= 0:
            return
        one_remove, one_add = _one_step(noise_multiplier, sample_rate, self.interval)
        self._symmetric = self._symmetric and sample_rate == 1.0
        power = _power if (self.squaring if squaring is None else squaring) else _self_compose
        self._remove = _compose(self._remove, power(one_remove, steps, self.tail), self.tail)
        self._add = (
            self._remove if one_add is one_remove and self._add is self._remove
            else _compose(self._add, power(one_add, steps, self.tail), self.tail)
        )  # fmt: skip

    def pld(self) -> PrivacyLossDistribution:
        """The PLD of the steps added so far (dp_accounting's identity PLD before any)."""
        remove = _dense(self._remove, self.interval)
        if self._symmetric:
            return PrivacyLossDistribution(remove)
        return PrivacyLossDistribution(remove, _dense(self._add, self.interval))


class CompositionCache:
    """The composers of the last runs composed (at most ``size``), so that a run extending
    one of them composes only its new segments (module docstring). Thread-safe; the result
    is the float a composition from scratch gives."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._entries: list[_Entry] = []  # the most recently used last
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def pld(
        self, segments: Sequence[tuple[Any, ...]], value_discretization_interval: float,
        tail_mass_truncation: float = TAIL_MASS_TRUNCATION,
    ) -> PrivacyLossDistribution:
        """``PLDComposer(value_discretization_interval, tail_mass_truncation)`` after
        ``PLDComposer.add(*segment)`` for each of ``segments`` ((sigma > 0, q in (0, 1],
        steps > 0) and optionally ``squaring``), starting from the longest kept composition
        that they extend."""
        segments = tuple(segments)
        key = (value_discretization_interval, tail_mass_truncation)
        if not segments:
            return PLDComposer(*key).pld()
        with self._lock:
            start, done = None, 0
            for entry in self._entries:
                got = entry.start(key, segments)
                if got is not None and got[1] >= done:
                    start, done = got
        composer = start.copy() if start is not None else PLDComposer(*key)
        if done < len(segments):
            for segment in segments[done:-1]:
                composer.add(*segment)
            before_last = composer.copy()
            composer.add(*segments[-1])
            entry = _Entry(key, segments, before_last, composer.copy())
            with self._lock:
                kept = [e for e in self._entries if e.segments != segments]
                self._entries = (kept + [entry])[-self.size :]
        return composer.pld()


class _Entry:
    """A composed run: its segments, the composer after all of them but the last, and the
    composer after all of them."""

    def __init__(
        self, key: tuple[float, float], segments: tuple[tuple[Any, ...], ...],
        before_last: PLDComposer, full: PLDComposer,
    ) -> None:
        self.key, self.segments, self.before_last, self.full = key, segments, before_last, full

    def start(
        self, key: tuple[float, float], segments: tuple[tuple[Any, ...], ...]
    ) -> tuple[PLDComposer, int] | None:
        """(composer, number of ``segments`` it has composed) to continue ``segments`` from,
        or None when this entry is not a prefix of them."""
        k = len(self.segments)
        if key != self.key or k == 0 or len(segments) < k - 1:
            return None
        if len(segments) >= k and segments[:k] == self.segments:
            return self.full, k
        if segments[: k - 1] == self.segments[: k - 1]:
            return self.before_last, k - 1
        return None


_CACHE = CompositionCache()


_ONE_STEP: dict[tuple[float, float, float], tuple[LossPmf, LossPmf]] = {}
_ONE_STEP_KEPT = 8
_ONE_STEP_LOCK = threading.Lock()


def _one_step(sigma: float, q: float, interval: float) -> tuple[LossPmf, LossPmf]:
    """``subsampled_gaussian_pmfs(sigma, q, interval)``, the same objects while among the
    last few built: a run growing one step at a time then self-composes the same arrays,
    whose transforms :func:`~.self_convolution.self_convolve` keeps."""
    key = (sigma, q, interval)
    with _ONE_STEP_LOCK:
        kept = _ONE_STEP.get(key)
    if kept is None:
        kept = subsampled_gaussian_pmfs(sigma, q, interval)
        with _ONE_STEP_LOCK:
            _ONE_STEP[key] = kept
            while len(_ONE_STEP) > _ONE_STEP_KEPT:
                del _ONE_STEP[next(iter(_ONE_STEP))]
    return kept


def clear_kept_compositions() -> None:
    """Forget the compositions that :func:`incremental_pld` keeps, and the one-step PLDs
    and transforms behind them (their memory, or a cold start for a timing)."""
    _CACHE.clear()
    with _ONE_STEP_LOCK:
        _ONE_STEP.clear()
    clear_transforms()


def incremental_pld(
    history: Iterable[tuple[float, float, int]], value_discretization_interval: float,
    noise_grouping: float = 0.0, max_groups: int | None = None,
) -> PrivacyLossDistribution:
    """The PLD of ``history`` through the process's :class:`CompositionCache`: called again
    with a longer run, it composes only the steps added since (the last segment is composed
    again when it has grown). With ``noise_grouping = 0``, :func:`compose_subsampled_gaussian`
    of ``history`` (the same float); else of its noise grouped (:func:`group_noise`), each
    group that merged distinct noise multipliers self-composed by squaring
    (``PLDComposer(squaring=True)``), a segment of one noise multiplier as without grouping.
    With ``max_groups``, grouped and discretised by :func:`bounded_groups`. An upper bound
    either way."""
    if max_groups is None:
        return _CACHE.pld(_grouped(history, noise_grouping), value_discretization_interval)
    groups, interval, _ = bounded_groups(
        list(history), value_discretization_interval, noise_grouping, max_groups
    )
    return _CACHE.pld(groups, interval)


def _dense(pmf: LossPmf, interval: float) -> pld_pmf.DensePLDPmf:
    return pld_pmf.DensePLDPmf(interval, pmf.lower, pmf.probs, pmf.infinity_mass, True)


def _self_compose(pmf: LossPmf, times: int, tail: float) -> LossPmf:
    """``DensePLDPmf.self_compose(times, tail)`` on arrays; ``pmf`` itself for one step."""
    if times == 1:
        return pmf
    low, probs = self_convolve(pmf.probs, times, tail)
    infinity = tail - math.expm1(times * math.log1p(-pmf.infinity_mass))
    return LossPmf(pmf.lower * times + low, np.asarray(probs, dtype=float), infinity)


def _power(pmf: LossPmf, times: int, tail: float) -> LossPmf:
    """``pmf`` composed with itself ``times`` times by repeated squaring with
    :func:`_compose` (``PLDComposer(squaring=True)``); ``pmf`` itself for one step."""
    out: LossPmf | None = None
    base = pmf
    while times:
        if times & 1:
            out = base if out is None else _compose(out, base, tail)
        times >>= 1
        if times:
            base = _compose(base, base, tail)
    assert out is not None  # times >= 1
    return out


def _compose(a: LossPmf, b: LossPmf, tail: float) -> LossPmf:
    """``DensePLDPmf.compose(other, tail)`` on arrays: FFT convolution, then pessimistic
    truncation of each tail of mass at most ``tail / 2``."""
    if a.probs.size == 1 and a.lower == 0 and a.infinity_mass == 0.0 and a.probs[0] == 1.0:
        probs = b.probs.copy()  # the identity: convolving with [1] changes nothing
    else:
        probs = signal.fftconvolve(a.probs, b.probs)
    infinity = a.infinity_mass + b.infinity_mass - a.infinity_mass * b.infinity_mass
    offset, probs, right = _truncate_tails(probs, tail)
    return LossPmf(a.lower + b.lower + offset, probs, infinity + right)


def _truncate_tails(probs: NDArray[np.float64], tail: float) -> tuple[int, NDArray[np.float64], float]:
    """The longest prefix and suffix of mass at most ``tail / 2`` each (running sums in
    dp_accounting's order), the left one added to the first kept point, the right one
    returned (it goes to infinity)."""
    if tail == 0:
        return 0, probs, 0.0
    half = tail / 2
    left = _first_above(np.cumsum(probs), half)
    right = probs.size - _first_above(np.cumsum(probs[::-1]), half)
    right = max(right, left + 1)
    left_mass = float(np.sum(probs[:left]))
    right_mass = float(np.sum(probs[right:]))
    kept = probs[left:right].copy()
    kept[0] += left_mass
    return left, kept, right_mass


def _first_above(running: NDArray[np.float64], threshold: float) -> int:
    """The first index whose running sum exceeds ``threshold`` (the length if none)."""
    above = running > threshold
    return int(np.argmax(above)) if above.any() else running.size

