"""One description of a DP-SGD run: :class:`DPSGDRun`.

A run is what every privacy model of this package reads (``docs/run_description.md``):

* ``segments``: ``(noise_multiplier, sample_rate, steps)`` runs of identical steps, oldest
  first, as Opacus accountants store them (``accountant.history``, run-length compressed).
  Units are multiples of the clipping norm C. A noise multiplier of 0 is allowed (Opacus
  accepts it); every model then says what it implies (usually epsilon = inf).
* ``weights`` (optional): the weight w_t with which step t's noisy gradient enters the final
  model (learning-rate schedules, momentum; :mod:`.optimizer_weights`). ``None`` means plain
  SGD at a constant learning rate, where every step has the same weight.
* ``normalisation`` (optional): what the batch-size-normalised mechanisms need and Opacus
  never passes to an accountant (:class:`Normalisation`).
* ``sampling`` (optional): how the batches were drawn (:mod:`.sampling`, ``docs/samplers.md``).
  ``None`` means Poisson sampling at the history's rates (what Opacus's ``DPDataLoader``
  draws, and what every model assumed before schemes existed: its numbers are unchanged).
* ``unit`` (optional): what one guarantee protects (:class:`~.privacy_unit.PrivacyUnit`): one
  record (the default), one user with at most k records, or a group of k records.

A run is validated once, where it enters (:meth:`DPSGDRun.from_history`, the constructor,
:meth:`DPSGDRun.constant`); everything that receives a :class:`DPSGDRun` trusts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numpy as np

from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_int,
    check_sample_rate,
    check_steps,
)
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.sampling import (
    SamplingScheme,
    advance_sampling,
    check_sampling,
    check_sampling_matches,
)

__all__ = [
    "DPSGDRun",
    "Normalisation",
    "TrainingSegment",
]

DivisorRule = Literal["sum", "public", "floored_expected", "realised"]
"""The type of :attr:`Normalisation.rule` (the dataclass :class:`Normalisation` describes a
normalised run; this literal names its divisor rule)."""
DIVISOR_RULES: tuple[str, ...] = ("sum", "public", "floored_expected", "realised")
"""What the noisy gradient sum is divided by: nothing (``"sum"``, SGM), a public constant
(``"public"``), Opacus 1.x's floor of a dataset-size-dependent expected batch size
(``"floored_expected"``, FEASGM) or the realised batch size (``"realised"``, ASGM)."""


def _check_sigma(value: object, name: str) -> float:
    return check_in_interval(name, value, 0.0, math.inf, low_open=False)


@dataclass(frozen=True, slots=True)
class TrainingSegment:
    """``steps`` consecutive DP-SGD steps with Poisson rate ``sample_rate`` in (0, 1] and
    noise standard deviation ``noise_multiplier`` >= 0 (in units of the clipping norm)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", _check_sigma(self.noise_multiplier, "noise_multiplier")
        )
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))

    @classmethod
    def _trusted(cls, noise_multiplier: float, sample_rate: float, steps: int) -> TrainingSegment:
        """A segment from values already validated (no checks: internal use only)."""
        seg = object.__new__(cls)
        object.__setattr__(seg, "noise_multiplier", noise_multiplier)
        object.__setattr__(seg, "sample_rate", sample_rate)
        object.__setattr__(seg, "steps", steps)
        return seg

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as the Opacus triple ``(noise_multiplier, sample_rate, steps)``."""
        return iter((self.noise_multiplier, self.sample_rate, self.steps))


@dataclass(frozen=True, slots=True)
class Normalisation:
    """What a normalised mechanism needs beyond the segments (``docs/normalisation.md``).

    Attributes:
        rule: one of :data:`DIVISOR_RULES`.
        dataset_size: N = len(dataset), an integer >= 1 (needed by every rule but "sum").
        batch_size: L, the DataLoader batch size given to ``make_private`` (FEASGM).
        drop_last: that DataLoader's ``drop_last`` (FEASGM).
        dimension: d, the number of trainable parameters (FEASGM's curve).
        public_divisor: the public constant divided by (rule "public").
    """

    rule: DivisorRule
    dataset_size: int | None = None
    batch_size: int | None = None
    drop_last: bool = False
    dimension: int | None = None
    public_divisor: float | None = None

    def __post_init__(self) -> None:
        if self.rule not in DIVISOR_RULES:
            raise ValueError(f"`rule` must be one of {DIVISOR_RULES}, got {self.rule!r}.")
        for name in ("dataset_size", "batch_size", "dimension"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_int(name, value, minimum=1))
        if not isinstance(self.drop_last, bool):
            raise TypeError(f"`drop_last` must be a bool, got {self.drop_last!r}.")
        if self.public_divisor is not None:
            object.__setattr__(
                self,
                "public_divisor",
                check_in_interval("public_divisor", self.public_divisor, 0.0, math.inf),
            )
        if self.rule == "public" and self.public_divisor is None:
            raise ValueError("`public_divisor` must be given when `rule` is 'public'.")
        if self.rule in ("floored_expected", "realised") and self.dataset_size is None:
            raise ValueError(f"`dataset_size` must be given when `rule` is {self.rule!r}.")


HistoryLike = Sequence[TrainingSegment] | Sequence[Sequence[float]] | Iterable[object]


def as_segments(history: HistoryLike, name: str = "history") -> tuple[TrainingSegment, ...]:
    """Validate a history and return it as a tuple of :class:`TrainingSegment`.

    Accepts segments or Opacus-style triples ``(noise_multiplier, sample_rate, steps)``;
    raises ``TypeError``/``ValueError`` naming the offending entry, e.g. ``history[2].steps``.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise TypeError(
            f"`{name}` must be a sequence of (noise_multiplier, sample_rate, steps), "
            f"got {history!r}."
        )
    out = []
    for i, entry in enumerate(history):
        if isinstance(entry, TrainingSegment):
            out.append(entry)
            continue
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Iterable):
            raise TypeError(
                f"`{name}[{i}]` must be a (noise_multiplier, sample_rate, steps) triple, "
                f"got {entry!r}."
            )
        values = tuple(entry)
        if len(values) != 3:
            raise TypeError(
                f"`{name}[{i}]` must be a (noise_multiplier, sample_rate, steps) triple, "
                f"got {entry!r}."
            )
        sigma, q, steps = values
        out.append(
            TrainingSegment._trusted(
                _check_sigma(sigma, f"{name}[{i}].noise_multiplier"),
                check_sample_rate(q, f"{name}[{i}].sample_rate"),
                check_steps(steps, f"{name}[{i}].steps"),
            )
        )
    return tuple(out)


def append_steps(
    history: list[TrainingSegment], noise_multiplier: float, sample_rate: float, steps: int = 1
) -> None:
    """Append ``steps`` steps at (``noise_multiplier``, ``sample_rate``) to the run-length
    ``history`` in place: the last segment grows when it has the same setting, else a segment
    is added. The values are trusted (the caller validates them)."""
    if history:
        last = history[-1]
        if last.noise_multiplier == noise_multiplier and last.sample_rate == sample_rate:
            history[-1] = TrainingSegment._trusted(noise_multiplier, sample_rate, last.steps + steps)
            return
    history.append(TrainingSegment._trusted(noise_multiplier, sample_rate, steps))


def runs_of(values: np.ndarray) -> list[tuple[float, int]]:
    """The runs of equal consecutive entries of ``values``: [(value, length), ...]."""
    if not values.size:
        return []
    cut = np.flatnonzero(values[1:] != values[:-1]) + 1
    starts, ends = np.concatenate(([0], cut)), np.concatenate((cut, [values.size]))
    return [(float(values[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]


def _check_weights(weights: object, steps: int) -> np.ndarray:
    try:
        w = np.array(weights, dtype=float, copy=True)
    except (TypeError, ValueError):
        raise TypeError(f"`weights` must be a sequence of real numbers, got {weights!r}.") from None
    if w.ndim != 1 or w.size != steps:
        raise ValueError(
            f"`weights` must have one entry per step ({steps}), got shape {w.shape}."
        )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        bad = int(np.flatnonzero(~(np.isfinite(w) & (w >= 0)))[0])
        raise ValueError(f"`weights[{bad}]` must be finite and >= 0, got {w[bad]!r}.")
    w.setflags(write=False)
    return w


_RECORD = PrivacyUnit.record()


@dataclass(frozen=True, eq=False)
class DPSGDRun:
    """A DP-SGD run, validated once (module docstring). Build it with
    :meth:`from_history` or :meth:`constant`; analysis objects accept it as is.

    Attributes:
        segments: the ``(noise_multiplier, sample_rate, steps)`` segments, oldest first.
        weights: per-step weights w_t >= 0 of the noisy gradients in the final model (read-only
            array, one per step), or ``None`` for plain SGD at a constant learning rate.
        normalisation: divisor rule and dataset facts, or ``None`` for the noisy sum (SGM).
        sampling: the sampling scheme (:mod:`.sampling`), or ``None`` for Poisson sampling at
            the segments' rates. A scheme must agree with every segment's sample rate
            (:func:`~.sampling.check_sampling_matches`).
        unit: the privacy unit (:class:`~.privacy_unit.PrivacyUnit`); one record by default.
    """

    segments: tuple[TrainingSegment, ...]
    weights: np.ndarray | None = None
    normalisation: Normalisation | None = None
    sampling: SamplingScheme | None = None
    unit: PrivacyUnit = _RECORD
    _validated: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._validated:
            return
        segments = as_segments(self.segments, "segments")
        object.__setattr__(self, "segments", segments)
        if self.weights is not None:
            total = sum(s.steps for s in segments)
            object.__setattr__(self, "weights", _check_weights(self.weights, total))
        if self.normalisation is not None and not isinstance(self.normalisation, Normalisation):
            raise TypeError(
                f"`normalisation` must be a Normalisation or None, got {self.normalisation!r}."
            )
        sampling = check_sampling(self.sampling)
        check_sampling_matches(sampling, [s.sample_rate for s in segments])
        if not isinstance(self.unit, PrivacyUnit):
            raise TypeError(f"`unit` must be a PrivacyUnit, got {self.unit!r}.")
        object.__setattr__(self, "_validated", True)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_history(
        cls,
        history: HistoryLike,
        *,
        weights: Sequence[float] | np.ndarray | None = None,
        normalisation: Normalisation | None = None,
        sampling: SamplingScheme | None = None,
        unit: PrivacyUnit = _RECORD,
    ) -> DPSGDRun:
        """The run of an Opacus-style history ``[(noise_multiplier, sample_rate, steps), ...]``
        (or :class:`TrainingSegment` s); segments with 0 steps are dropped."""
        segments = tuple(s for s in as_segments(history) if s.steps > 0)
        return cls(segments, weights, normalisation, sampling, unit)  # type: ignore[arg-type]  # validated in __post_init__

    @classmethod
    def constant(
        cls,
        *,
        steps: int,
        sample_rate: float,
        noise_multiplier: float,
        sampling: SamplingScheme | None = None,
        unit: PrivacyUnit = _RECORD,
    ) -> DPSGDRun:
        """T = ``steps`` steps at constant (q, sigma), batches drawn by ``sampling``, for the
        privacy ``unit``."""
        seg = TrainingSegment(noise_multiplier, sample_rate, steps)  # errors name the argument
        if sampling is None and unit is _RECORD:
            return cls._trusted((seg,) if seg.steps else ())
        return cls((seg,) if seg.steps else (), sampling=sampling, unit=unit)

    @classmethod
    def _trusted(
        cls,
        segments: tuple[TrainingSegment, ...],
        weights: np.ndarray | None = None,
        normalisation: Normalisation | None = None,
        sampling: SamplingScheme | None = None,
        unit: PrivacyUnit = _RECORD,
    ) -> DPSGDRun:
        """A run from parts that are already valid (internal: no checks, no copies)."""
        return cls(segments, weights, normalisation, sampling, unit, _validated=True)

    # -- derived quantities (computed once) -----------------------------------------------

    @cached_property
    def num_steps(self) -> int:
        """T, the total number of steps."""
        return sum(s.steps for s in self.segments)

    @cached_property
    def has_zero_noise(self) -> bool:
        """Whether some step has noise multiplier 0."""
        return any(s.noise_multiplier == 0.0 for s in self.segments)

    @cached_property
    def is_constant(self) -> bool:
        """One (sigma, q) for every step and no per-step weights."""
        return self.weights is None and len({(s.noise_multiplier, s.sample_rate) for s in self.segments}) <= 1

    def as_history(self) -> list[tuple[float, float, int]]:
        """The Opacus form ``[(noise_multiplier, sample_rate, steps), ...]``."""
        return [(s.noise_multiplier, s.sample_rate, s.steps) for s in self.segments]

    def per_step(self) -> tuple[np.ndarray, np.ndarray]:
        """(noise multipliers, sample rates), one entry per step."""
        counts = [s.steps for s in self.segments]
        return (
            np.repeat([s.noise_multiplier for s in self.segments], counts).astype(float),
            np.repeat([s.sample_rate for s in self.segments], counts).astype(float),
        )

    def suffix(self, steps: int) -> DPSGDRun:
        """The last ``steps`` steps (what a regulariser that zeroes the model keeps); an epoch
        scheme's ``first_step_in_epoch`` moves to where the suffix starts."""
        weights = None if self.weights is None else self.weights[self.num_steps - steps :]
        sampling = self.sampling
        if sampling is not None:
            sampling = advance_sampling(sampling, max(0, self.num_steps - steps))
        return DPSGDRun._trusted(
            suffix(self.segments, steps), weights, self.normalisation, sampling, self.unit
        )


RunLike = DPSGDRun | HistoryLike


def total_steps(segments: Sequence[TrainingSegment]) -> int:
    """Total number of steps of validated segments."""
    return sum(s.steps for s in segments)


def prefix(segments: Sequence[TrainingSegment], steps: int) -> tuple[TrainingSegment, ...]:
    """The first ``steps`` steps of validated segments (the run as it was after them)."""
    return tuple(_take(segments, steps))


def suffix(segments: Sequence[TrainingSegment], steps: int) -> tuple[TrainingSegment, ...]:
    """The last ``steps`` steps of validated segments (what a zeroing regulariser keeps)."""
    return tuple(reversed(_take(reversed(segments), steps)))


def _take(segments: Iterable[TrainingSegment], steps: int) -> list[TrainingSegment]:
    """The first ``steps`` steps of ``segments`` in the order given."""
    out: list[TrainingSegment] = []
    remaining = steps
    for seg in segments:
        if remaining <= 0:
            break
        take = min(seg.steps, remaining)
        if take > 0:
            out.append(TrainingSegment._trusted(seg.noise_multiplier, seg.sample_rate, take))
        remaining -= take
    return out


def as_run(run: RunLike, name: str = "history") -> DPSGDRun:
    """A :class:`DPSGDRun` as is, or a history validated into one (the boundary)."""
    if isinstance(run, DPSGDRun):
        return run
    return DPSGDRun.from_history(as_segments(run, name))
