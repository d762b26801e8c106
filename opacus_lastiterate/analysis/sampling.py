"""How the batches of a run were drawn: the sampling scheme (``docs/samplers.md``).

A sampling scheme is a small, immutable, validated description, in the style of
dp_accounting's events:

* :class:`PoissonSampling` (``rate``): every record independently with probability q at each
  step (Opacus's ``DPDataLoader``);
* :class:`ShuffledBatches` (``dataset_size``, ``batch_size``, ``drop_last``): a fresh uniformly
  random permutation of the records each epoch, cut into consecutive batches of
  ``batch_size`` (a ``DataLoader`` with ``shuffle=True``, i.e. ``RandomSampler``);
* :class:`DeterministicBatches` (same fields): the same order every epoch (``SequentialSampler``);
* :class:`BallsInBins` (``steps_per_epoch``): every record in one uniformly chosen step of each
  epoch, independently of the others (batch sizes vary);
* :class:`UnknownSampling` (``sampler_name``, ``assumed``): a sampler whose privacy the package
  cannot model; every number is computed for the ``assumed`` scheme and says so.

:data:`SamplingScheme` is their union. Every scheme has a :attr:`name` literal
(:data:`SAMPLING_NAMES`), :attr:`steps_per_epoch` (``None`` for Poisson, which has no
epochs), :meth:`describe` (the label text) and :meth:`as_dict` (JSON);
:func:`sampling_from_dict` reads the latter back.

Epochs start at the run's first step unless ``first_step_in_epoch`` says the run starts
part-way into one (what :meth:`DPSGDRun.suffix <.run.DPSGDRun.suffix>` keeps, and what a run
resumed mid-epoch has).

:func:`check_sampling_matches` is the check :class:`~.run.DPSGDRun` makes once: a scheme must
agree with the sample rates the accountant recorded (Opacus records q = 1 / len(data_loader)
for every loader).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np

from opacus_lastiterate.analysis._validation import check_int, check_sample_rate

__all__ = [
    "BallsInBins",
    "DeterministicBatches",
    "PoissonSampling",
    "ShuffledBatches",
    "UnknownSampling",
]

SAMPLING_NAMES: tuple[str, ...] = ("poisson", "shuffled", "deterministic", "balls_in_bins", "unknown")
"""Every scheme's :attr:`name`, in the order of the module docstring."""

RATE_RELATIVE_TOLERANCE = 1e-9
"""Relative tolerance with which a recorded sample rate must match a scheme's rate
(:func:`check_sampling_matches`): floating-point arithmetic, not a modelling slack."""


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool, got {value!r} of type {type(value).__name__}.")
    return bool(value)


def _check_first_step(value: object, steps_per_epoch: int) -> int:
    first = check_int("first_step_in_epoch", value, minimum=0)
    if first >= steps_per_epoch:
        raise ValueError(
            f"`first_step_in_epoch` must be an integer in [0, {steps_per_epoch - 1}] "
            f"(steps_per_epoch = {steps_per_epoch}), got {first}."
        )
    return first


@dataclass(frozen=True, slots=True)
class PoissonSampling:
    """Each record is in each step's batch independently with probability ``rate`` in (0, 1]."""

    rate: float
    name: ClassVar[Literal["poisson"]] = "poisson"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", check_sample_rate(self.rate, "rate"))

    @property
    def steps_per_epoch(self) -> None:
        """Poisson sampling has no epochs: ``None``."""
        return None

    @property
    def sample_rate(self) -> float:
        """The probability that a given record is in a given step's batch: q."""
        return self.rate

    def describe(self) -> str:
        """One line: the scheme and its parameters."""
        return f"Poisson sampling (each record in each batch independently, q = {self.rate:.6g})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:func:`sampling_from_dict` reads it back)."""
        return {"name": self.name, "rate": self.rate}


_F = TypeVar("_F", bound="_FixedSizeBatches")


@dataclass(frozen=True, slots=True)
class _FixedSizeBatches:
    """Shared fields and arithmetic of the two fixed-size-batch schemes."""

    dataset_size: int
    batch_size: int
    drop_last: bool = False
    first_step_in_epoch: int = 0

    def __post_init__(self) -> None:
        n = check_int("dataset_size", self.dataset_size, minimum=1)
        object.__setattr__(self, "dataset_size", n)
        b = check_int("batch_size", self.batch_size, minimum=1)
        if b > n:
            raise ValueError(
                f"`batch_size` must be an integer in [1, dataset_size = {n}], got {b}."
            )
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "drop_last", _check_bool("drop_last", self.drop_last))
        object.__setattr__(
            self,
            "first_step_in_epoch",
            _check_first_step(self.first_step_in_epoch, self.steps_per_epoch),
        )

    @property
    def steps_per_epoch(self) -> int:
        """len(data_loader): floor(N / B) with ``drop_last``, else ceil(N / B)."""
        n, b = self.dataset_size, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """The size of each batch of an epoch, in order (the last one may be smaller)."""
        n, b, k = self.dataset_size, self.batch_size, self.steps_per_epoch
        return tuple(min(b, n - j * b) for j in range(k))

    @property
    def sample_rate(self) -> float:
        """The probability that a given record is in a given full batch: B / N."""
        return self.batch_size / self.dataset_size

    def advanced(self: _F, steps: int) -> _F:
        """The same scheme for a run that starts ``steps`` steps later (a suffix of this run)."""
        first = (self.first_step_in_epoch + check_int("steps", steps)) % self.steps_per_epoch
        return replace(self, first_step_in_epoch=first)

    def step_probabilities(self) -> np.ndarray:
        """Pr[a given record is in batch j of an epoch] = |batch j| / N, one per step of an
        epoch. With ``drop_last`` they sum to 1 - (N mod B) / N (the dropped records)."""
        return np.asarray(self.batch_sizes, dtype=float) / self.dataset_size

    def _fields_text(self) -> str:
        last = "last partial batch dropped" if self.drop_last else "last partial batch kept"
        if self.dataset_size % self.batch_size == 0:
            last = "no partial batch"
        return (
            f"N = {self.dataset_size}, B = {self.batch_size}, "
            f"{self.steps_per_epoch} steps per epoch, {last}"
        )

    def _base_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "steps_per_epoch": self.steps_per_epoch,
        }
        if self.first_step_in_epoch:
            out["first_step_in_epoch"] = self.first_step_in_epoch
        return out


@dataclass(frozen=True, slots=True)
class ShuffledBatches(_FixedSizeBatches):
    """A fresh uniformly random permutation of the ``dataset_size`` records each epoch, cut
    into consecutive batches of ``batch_size`` (the last one smaller, or dropped with
    ``drop_last``). ``first_step_in_epoch``: where in an epoch the run's first step is (0)."""

    name: ClassVar[Literal["shuffled"]] = "shuffled"

    def describe(self) -> str:
        """One line: the scheme and its parameters."""
        return f"shuffled fixed-size batches (a new random permutation each epoch; {self._fields_text()})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:func:`sampling_from_dict` reads it back)."""
        return {"name": self.name, **self._base_dict()}


@dataclass(frozen=True, slots=True)
class DeterministicBatches(_FixedSizeBatches):
    """The same order of the ``dataset_size`` records every epoch, cut into consecutive
    batches of ``batch_size`` (the last one smaller, or dropped with ``drop_last``): each
    record is at one fixed step of every epoch."""

    name: ClassVar[Literal["deterministic"]] = "deterministic"

    def describe(self) -> str:
        """One line: the scheme and its parameters."""
        return f"deterministic batches (the same order every epoch; {self._fields_text()})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:func:`sampling_from_dict` reads it back)."""
        return {"name": self.name, **self._base_dict()}


@dataclass(frozen=True, slots=True)
class BallsInBins:
    """Each record is put in one of the ``steps_per_epoch`` steps of each epoch, chosen
    uniformly at random and independently of the other records and of other epochs.
    ``first_step_in_epoch``: where in an epoch the run's first step is (0)."""

    steps_per_epoch: int
    first_step_in_epoch: int = 0
    name: ClassVar[Literal["balls_in_bins"]] = "balls_in_bins"

    def __post_init__(self) -> None:
        k = check_int("steps_per_epoch", self.steps_per_epoch, minimum=1)
        object.__setattr__(self, "steps_per_epoch", k)
        object.__setattr__(
            self, "first_step_in_epoch", _check_first_step(self.first_step_in_epoch, k)
        )

    @property
    def sample_rate(self) -> float:
        """The probability that a given record is in a given step's batch: 1 / steps_per_epoch."""
        return 1.0 / self.steps_per_epoch

    def advanced(self, steps: int) -> BallsInBins:
        """The same scheme for a run that starts ``steps`` steps later (a suffix of this run)."""
        first = (self.first_step_in_epoch + check_int("steps", steps)) % self.steps_per_epoch
        return replace(self, first_step_in_epoch=first)

    def step_probabilities(self) -> np.ndarray:
        """1 / steps_per_epoch for every step of an epoch."""
        return np.full(self.steps_per_epoch, 1.0 / self.steps_per_epoch)

    def describe(self) -> str:
        """One line: the scheme and its parameters."""
        return (
            "balls-in-bins (each record in one uniformly chosen step of each epoch; "
            f"{self.steps_per_epoch} steps per epoch)"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:func:`sampling_from_dict` reads it back)."""
        out: dict[str, Any] = {"name": self.name, "steps_per_epoch": self.steps_per_epoch}
        if self.first_step_in_epoch:
            out["first_step_in_epoch"] = self.first_step_in_epoch
        return out


EpochScheme = ShuffledBatches | DeterministicBatches | BallsInBins
"""The schemes with epochs (every record used at most once per epoch)."""
_KNOWN = (PoissonSampling, ShuffledBatches, DeterministicBatches, BallsInBins)


@dataclass(frozen=True, slots=True)
class UnknownSampling:
    """A sampler the package cannot model (``sampler_name``, e.g. ``"WeightedRandomSampler"``);
    every number of the run is computed for the ``assumed`` scheme and labelled as assuming it."""

    sampler_name: str
    assumed: PoissonSampling | ShuffledBatches | DeterministicBatches | BallsInBins
    name: ClassVar[Literal["unknown"]] = "unknown"

    def __post_init__(self) -> None:
        if not isinstance(self.sampler_name, str) or not self.sampler_name:
            raise TypeError(
                f"`sampler_name` must be a non-empty string, got {self.sampler_name!r}."
            )
        if not isinstance(self.assumed, _KNOWN):
            raise TypeError(
                "`assumed` must be a PoissonSampling, ShuffledBatches, DeterministicBatches "
                f"or BallsInBins, got {self.assumed!r}."
            )

    @property
    def steps_per_epoch(self) -> int | None:
        """The assumed scheme's steps per epoch."""
        return self.assumed.steps_per_epoch

    @property
    def sample_rate(self) -> float:
        """The assumed scheme's per-step inclusion probability."""
        return self.assumed.sample_rate

    def describe(self) -> str:
        """One line: the sampler and what the numbers assume."""
        return (
            f"unknown sampler {self.sampler_name!r}: numbers assume {self.assumed.describe()}, "
            "not a guarantee for this run"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:func:`sampling_from_dict` reads it back)."""
        return {"name": self.name, "sampler_name": self.sampler_name, "assumed": self.assumed.as_dict()}


SamplingScheme = (
    PoissonSampling | ShuffledBatches | DeterministicBatches | BallsInBins | UnknownSampling
)
"""Any sampling scheme (module docstring)."""
_ALL = (*_KNOWN, UnknownSampling)


def check_sampling(value: object, name: str = "sampling") -> SamplingScheme | None:
    """``value`` if it is a :data:`SamplingScheme` or ``None``, else ``TypeError``."""
    if value is None or isinstance(value, _ALL):
        return value  # type: ignore[return-value]
    raise TypeError(
        f"`{name}` must be None or one of PoissonSampling, ShuffledBatches, "
        f"DeterministicBatches, BallsInBins, UnknownSampling; got {value!r}."
    )


def effective_sampling(
    sampling: SamplingScheme | None,
) -> PoissonSampling | ShuffledBatches | DeterministicBatches | BallsInBins | None:
    """The scheme the numbers are computed for: ``assumed`` for :class:`UnknownSampling`,
    the scheme itself otherwise (``None``: Poisson at the history's rates)."""
    return sampling.assumed if isinstance(sampling, UnknownSampling) else sampling


def advance_sampling(sampling: SamplingScheme | None, steps: int) -> SamplingScheme | None:
    """``sampling`` for the run that starts ``steps`` steps later (a suffix): epoch schemes
    move their ``first_step_in_epoch``; Poisson and ``None`` are unchanged."""
    if isinstance(sampling, UnknownSampling):
        assumed = sampling.assumed
        if not isinstance(assumed, PoissonSampling):
            assumed = assumed.advanced(steps)
        return replace(sampling, assumed=assumed)
    if sampling is None or isinstance(sampling, PoissonSampling):
        return sampling
    return sampling.advanced(steps)


def _allowed_rates(scheme: PoissonSampling | EpochScheme) -> tuple[float, float, str]:
    if isinstance(scheme, PoissonSampling):
        return scheme.rate, scheme.rate, f"the scheme's rate {scheme.rate!r}"
    if isinstance(scheme, BallsInBins):
        q = 1.0 / scheme.steps_per_epoch
        return q, q, f"1 / steps_per_epoch = {q!r}"
    implied, opacus = scheme.sample_rate, 1.0 / scheme.steps_per_epoch
    lo, hi = min(implied, opacus), max(implied, opacus)
    if lo == hi:
        return lo, hi, f"B / N = 1 / steps_per_epoch = {lo!r}"
    return lo, hi, (
        f"between B / N = {implied!r} and Opacus's 1 / len(data_loader) = {opacus!r}"
    )


def check_sampling_matches(
    sampling: SamplingScheme | None, sample_rates: Sequence[float], name: str = "sampling"
) -> None:
    """Raise ``ValueError`` unless every recorded ``sample_rates[i]`` agrees with ``sampling``.

    Allowed (each to a relative tolerance of :data:`RATE_RELATIVE_TOLERANCE`):

    * Poisson: the scheme's ``rate``;
    * shuffled or deterministic batches: a rate between B / N and 1 / steps_per_epoch (what
      Opacus records, 1 / len(data_loader));
    * balls-in-bins: 1 / steps_per_epoch;
    * unknown: what its ``assumed`` scheme allows;
    * ``None``: anything (Poisson at the recorded rates).
    """
    scheme = effective_sampling(sampling)
    if scheme is None:
        return
    lo, hi, allowed = _allowed_rates(scheme)
    slack = RATE_RELATIVE_TOLERANCE
    for i, q in enumerate(sample_rates):
        if not (lo * (1.0 - slack) <= q <= hi * (1.0 + slack)):
            raise ValueError(
                f"`{name}` ({scheme.describe()}) does not match the recorded sample rate "
                f"history[{i}].sample_rate = {q!r}: it must be {allowed} "
                f"(relative tolerance {slack:g})."
            )


def sampling_from_dict(data: Mapping[str, Any]) -> SamplingScheme:
    """The scheme of :meth:`as_dict`'s output (derived keys such as ``steps_per_epoch`` of the
    fixed-size schemes are checked against the fields)."""
    if not isinstance(data, Mapping):
        raise TypeError(f"`data` must be a mapping, got {data!r}.")
    name = data.get("name")
    first = data.get("first_step_in_epoch", 0)
    scheme: SamplingScheme
    if name == "poisson":
        scheme = PoissonSampling(data["rate"])
    elif name in ("shuffled", "deterministic"):
        cls = ShuffledBatches if name == "shuffled" else DeterministicBatches
        scheme = cls(data["dataset_size"], data["batch_size"], data.get("drop_last", False), first)
        stated = data.get("steps_per_epoch", scheme.steps_per_epoch)
        if stated != scheme.steps_per_epoch:
            raise ValueError(
                f"`data['steps_per_epoch']` must be {scheme.steps_per_epoch} for these fields, "
                f"got {stated!r}."
            )
    elif name == "balls_in_bins":
        scheme = BallsInBins(data["steps_per_epoch"], first)
    elif name == "unknown":
        assumed = sampling_from_dict(data["assumed"])
        if isinstance(assumed, UnknownSampling):
            raise ValueError("`data['assumed']` must name a known scheme, not 'unknown'.")
        scheme = UnknownSampling(data["sampler_name"], assumed)
    else:
        raise ValueError(f"`data['name']` must be one of {', '.join(SAMPLING_NAMES)}, got {name!r}.")
    return scheme

