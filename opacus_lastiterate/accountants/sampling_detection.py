"""Which batches does this data loader draw? :func:`detect_sampling`.

Opacus records ``sample_rate = 1 / len(data_loader)`` whatever the loader draws, and its
accountants assume Poisson sampling. This module reads the loader that training actually uses
and names its sampling scheme (:mod:`opacus_lastiterate.analysis.sampling`): Poisson for
Opacus's ``DPDataLoader``, balls-in-bins for
:class:`~opacus_lastiterate.samplers.BallsInBinsBatchSampler`, shuffled or deterministic
fixed-size batches for a ``BatchSampler`` over ``RandomSampler``/``SubsetRandomSampler``,
``SequentialSampler`` or ``DistributedSampler`` (global batch = per-rank batch x ranks),
looking through wrappers with a ``batch_sampler`` attribute (Accelerate's
``BatchSamplerShard``); over a :class:`~opacus_lastiterate.user_samplers.UserDataset` the
scheme is over users and the unit is
:meth:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit.sampled_user`; anything else is
unknown (the numbers assume Poisson at Opacus's rate, and say so). ``docs/samplers.md``, "In
training: what the package reads from your loader", has the table.

Detection never raises on a loader Opacus accepts: what it cannot read is "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    SamplingScheme,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.samplers import BallsInBinsBatchSampler
from opacus_lastiterate.user_samplers import UserDataset

__all__ = ["DetectedSampling", "detect_sampling"]

_MAX_WRAPPERS = 6


@dataclass(frozen=True)
class DetectedSampling:
    """What :func:`detect_sampling` found.

    Attributes:
        scheme: the sampling scheme the numbers are computed for (for an unknown sampler,
            an :class:`UnknownSampling` that names the scheme assumed).
        sampler: the qualified class name of the sampler that decided it.
        modelled: whether the package models this sampler's privacy (False: unknown).
        unit: the privacy unit of the loader's items: ``PrivacyUnit.sampled_user()`` for a
            loader over a :class:`~opacus_lastiterate.user_samplers.UserDataset` (the
            scheme's sizes and rates then count users), one record otherwise.
    """

    scheme: SamplingScheme
    sampler: str
    modelled: bool
    unit: PrivacyUnit = field(default_factory=PrivacyUnit.record)


def _qualname(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _poisson_types() -> tuple[type, ...]:
    from opacus.utils.uniform_sampler import (  # where every Opacus 1.x defines them
        DistributedUniformWithReplacementSampler,
        UniformWithReplacementSampler,
    )

    return (UniformWithReplacementSampler, DistributedUniformWithReplacementSampler)


def _unknown(name: str, opacus_rate: float) -> DetectedSampling:
    return DetectedSampling(
        UnknownSampling(sampler_name=name, assumed=PoissonSampling(rate=opacus_rate)),
        name,
        False,
    )


def _from_index_sampler(
    sampler: Any, batch_size: int, drop_last: bool, world_size: int, opacus_rate: float
) -> DetectedSampling:
    """The scheme of fixed-size batches of ``batch_size`` (per rank) over ``sampler``."""
    name = _qualname(sampler)
    if isinstance(sampler, DistributedSampler):
        size = len(sampler.dataset)  # type: ignore[arg-type]
        replicas = int(sampler.num_replicas)
        if not sampler.drop_last and size % replicas:
            # DistributedSampler pads the permutation by repeating records: those are used
            # twice per epoch, which no fixed-size scheme describes.
            return _unknown(name + " (pads by repeating records)", opacus_rate)
        cls = ShuffledBatches if sampler.shuffle else DeterministicBatches
        used = size - size % replicas if sampler.drop_last else size
        return DetectedSampling(
            cls(dataset_size=used, batch_size=batch_size * replicas, drop_last=drop_last),
            name,
            True,
        )
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler.num_samples != len(sampler.data_source):  # type: ignore[arg-type]
            return _unknown(name + " (replacement or num_samples)", opacus_rate)
        cls_r: type = ShuffledBatches
        size = len(sampler.data_source)  # type: ignore[arg-type]
    elif isinstance(sampler, SubsetRandomSampler):
        cls_r = ShuffledBatches
        size = len(sampler.indices)
    elif isinstance(sampler, SequentialSampler):
        cls_r = DeterministicBatches
        size = len(sampler.data_source)  # type: ignore[arg-type]
    else:
        return _unknown(name, opacus_rate)
    return DetectedSampling(
        cls_r(dataset_size=size, batch_size=batch_size * world_size, drop_last=drop_last),
        name,
        True,
    )


def _detect(batch_sampler: Any, world_size: int, opacus_rate: float) -> DetectedSampling:
    for _ in range(_MAX_WRAPPERS):
        if isinstance(batch_sampler, _poisson_types()):
            return DetectedSampling(
                PoissonSampling(rate=float(batch_sampler.sample_rate)),  # type: ignore[attr-defined]
                _qualname(batch_sampler),
                True,
            )
        if isinstance(batch_sampler, BallsInBinsBatchSampler):
            return DetectedSampling(
                BallsInBins(steps_per_epoch=batch_sampler.steps_per_epoch),
                _qualname(batch_sampler),
                True,
            )
        if isinstance(batch_sampler, BatchSampler):
            return _from_index_sampler(
                batch_sampler.sampler,
                int(batch_sampler.batch_size),
                bool(batch_sampler.drop_last),
                world_size,
                opacus_rate,
            )
        inner = getattr(batch_sampler, "batch_sampler", None)
        if inner is None or inner is batch_sampler:
            break
        batch_sampler = inner  # a wrapper (accelerate's BatchSamplerShard, ...)
    return _unknown(_qualname(batch_sampler), opacus_rate)


def detect_sampling(data_loader: object, *, world_size: int = 1) -> DetectedSampling:
    """The sampling scheme of ``data_loader``, the loader that training iterates.

    Args:
        data_loader: a ``torch.utils.data.DataLoader`` (or a wrapper of one, such as
            Accelerate's ``DataLoaderShard``), as ``make_private`` returns it.
        world_size: the number of DDP processes sharing each step's batch (a per-rank
            ``BatchSampler`` of size B makes global batches of ``B * world_size``); the
            distributed samplers of Opacus and torch carry their own.

    Returns:
        :class:`DetectedSampling` (with the unit of the loader's items); never raises on a
        loader Opacus accepts. An unknown
        sampler is reported as such, with Poisson at Opacus's rate ``1 / len(data_loader)``
        as the assumed scheme.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"`world_size` must be an integer >= 1, got {world_size!r}.")
    try:
        opacus_rate = 1.0 / len(data_loader)  # type: ignore[arg-type]
    except (TypeError, ZeroDivisionError):
        opacus_rate = 1.0
    detected = _detect_scheme(data_loader, world_size, opacus_rate)
    if isinstance(getattr(data_loader, "dataset", None), UserDataset):
        return replace(detected, unit=PrivacyUnit.sampled_user())
    return detected


def _detect_scheme(data_loader: object, world_size: int, opacus_rate: float) -> DetectedSampling:
    if isinstance(data_loader, DataLoader) and isinstance(data_loader.dataset, IterableDataset):
        return _unknown("IterableDataset", opacus_rate)
    batch_sampler = getattr(data_loader, "batch_sampler", None)
    if batch_sampler is None:
        return _unknown(_qualname(data_loader), opacus_rate)
    try:
        return _detect(batch_sampler, world_size, opacus_rate)
    except Exception as exc:  # a loader Opacus accepts must never abort training here
        return _unknown(f"{_qualname(batch_sampler)} (unreadable: {exc})", opacus_rate)
