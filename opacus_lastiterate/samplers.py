"""Balls-in-bins batches for PyTorch: every record once per epoch, in a uniformly random step.

In each epoch of ``steps_per_epoch`` steps, :class:`BallsInBinsBatchSampler` throws every
record of the dataset into one of the steps, uniformly at random and independently of the
other records ("balls into bins"), and yields the steps' batches in order. A record is
therefore used exactly once per epoch, like a shuffled loader, while its batch sizes vary
like Poisson sampling's (binomial with mean N / steps_per_epoch), which gives amplification
by sampling that fixed-size shuffled batches do not have. The scheme and its accounting are
described in ``docs/samplers.md`` (Chua et al., "Balls-and-Bins Sampling for DP-SGD",
arXiv 2412.16802, AISTATS 2025); the accountants of this package recognise it when it is the batch sampler
of the loader handed to ``PrivacyEngine.make_private(..., poisson_sampling=False)``.

:func:`balls_in_bins_data_loader` turns a user's ``DataLoader`` into one drawing balls-in-bins
batches (an empty step yields an empty batch, collated the way Opacus's ``DPDataLoader``
collates one). Under DDP every rank builds the sampler with the same ``seed`` and calls
:meth:`BallsInBinsBatchSampler.set_epoch` each epoch, like ``DistributedSampler``: the ranks
then draw the same bins and each takes its share of every batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.samplers", "torch"):
    import torch
    from torch.utils.data import DataLoader, IterableDataset, Sampler

from opacus_lastiterate.analysis._validation import check_int

__all__ = ["BallsInBinsBatchSampler", "balls_in_bins_data_loader"]


class BallsInBinsBatchSampler(Sampler[list[int]]):
    """Batches of indices ``0 .. dataset_size - 1``: each index in one uniformly random step
    of each epoch of ``steps_per_epoch`` steps.

    Args:
        dataset_size: N >= 1, the number of records.
        steps_per_epoch: b >= 1, the number of steps (batches) per epoch; the expected batch
            size is N / b (per rank: N / (b * num_replicas)).
        generator: the random generator of a single-process run (``None``: a seed is drawn
            from torch's default generator at each epoch, as ``RandomSampler`` does).
        num_replicas, rank: DDP: the number of processes and this process's rank; every rank
            must use the same ``seed`` and call :meth:`set_epoch`. ``None`` and ``None``: one
            process.
        seed: the shared seed of the distributed bins (used only with ``num_replicas``).

    Raises:
        TypeError, ValueError: naming the offending argument.
    """

    def __init__(
        self,
        dataset_size: int,
        steps_per_epoch: int,
        *,
        generator: torch.Generator | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int = 0,
    ) -> None:
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=1)
        self.steps_per_epoch = check_int("steps_per_epoch", steps_per_epoch, minimum=1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"`generator` must be a torch.Generator or None, got {generator!r}.")
        if (num_replicas is None) != (rank is None):
            raise ValueError(
                "`num_replicas` and `rank` must be given together (DDP) or both left None, "
                f"got num_replicas={num_replicas!r}, rank={rank!r}."
            )
        if num_replicas is not None:
            num_replicas = check_int("num_replicas", num_replicas, minimum=1)
            rank = check_int("rank", rank, minimum=0)
            if rank >= num_replicas:
                raise ValueError(
                    f"`rank` must be in [0, num_replicas - 1] = [0, {num_replicas - 1}], "
                    f"got {rank}."
                )
            if generator is not None:
                raise ValueError(
                    "`generator` must be None with `num_replicas`: the ranks must draw the "
                    "same bins, from the shared `seed` and the epoch (set_epoch)."
                )
        self.num_replicas = num_replicas
        self.rank = rank
        self.seed = check_int("seed", seed, minimum=0)
        self.generator = generator
        self.epoch = 0

    @property
    def distributed(self) -> bool:
        """Whether the batches are shared out between DDP ranks."""
        return self.num_replicas is not None

    @property
    def expected_batch_size(self) -> float:
        """N / steps_per_epoch (per rank under DDP: divided by ``num_replicas``)."""
        return self.dataset_size / self.steps_per_epoch / (self.num_replicas or 1)

    def set_epoch(self, epoch: int) -> None:
        """Use the bins of epoch ``epoch`` (DDP: call it on every rank before each epoch)."""
        self.epoch = check_int("epoch", epoch, minimum=0)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def _epoch_generator(self) -> torch.Generator:
        if self.distributed:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            return generator
        if self.generator is not None:
            return self.generator
        generator = torch.Generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        return generator

    def __iter__(self) -> Iterator[list[int]]:
        bins = torch.randint(
            self.steps_per_epoch, (self.dataset_size,), generator=self._epoch_generator()
        )
        order = torch.argsort(bins, stable=True)
        counts = torch.bincount(bins, minlength=self.steps_per_epoch).tolist()
        for batch in torch.split(order, counts):
            if self.num_replicas is not None:
                batch = batch[self.rank :: self.num_replicas]
            yield batch.tolist()


def balls_in_bins_data_loader(
    data_loader: DataLoader,
    *,
    steps_per_epoch: int | None = None,
    generator: torch.Generator | None = None,
    num_replicas: int | None = None,
    rank: int | None = None,
    seed: int = 0,
) -> DataLoader:
    """A ``DataLoader`` over ``data_loader``'s dataset drawing balls-in-bins batches.

    Pass it to ``PrivacyEngine.make_private(..., poisson_sampling=False)`` (with
    ``poisson_sampling=True`` Opacus replaces any loader by its Poisson ``DPDataLoader``).
    Opacus then records the sample rate 1 / steps_per_epoch, which is the rate of each record's
    step, and this package's accountants account the run as balls-in-bins.

    Args:
        data_loader: the user's loader (a map-style dataset); its collate function, workers
            and memory settings are kept.
        steps_per_epoch: steps per epoch (default: ``len(data_loader)``, so an epoch has as
            many steps as before).
        generator, num_replicas, rank, seed: as for :class:`BallsInBinsBatchSampler`.

    Raises:
        TypeError, ValueError: naming the offending argument (an ``IterableDataset`` has no
            records to throw into bins).
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"`data_loader` must be a torch DataLoader, got {data_loader!r}.")
    dataset: Any = data_loader.dataset
    if isinstance(dataset, IterableDataset):
        raise ValueError(
            "`data_loader` must be over a map-style dataset (records are indexed), "
            "got an IterableDataset."
        )
    from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
    from torch.utils.data import default_collate

    steps = len(data_loader) if steps_per_epoch is None else steps_per_epoch
    if generator is None and num_replicas is None:
        generator = data_loader.generator
    sampler = BallsInBinsBatchSampler(
        len(dataset),
        steps,
        generator=generator,
        num_replicas=num_replicas,
        rank=rank,
        seed=seed,
    )
    first = dataset[0]
    collate = wrap_collate_with_empty(
        collate_fn=data_loader.collate_fn or default_collate,
        sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
        dtypes=[dtype_safe(x) for x in first],
    )
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=data_loader.num_workers,
        pin_memory=data_loader.pin_memory,
        timeout=data_loader.timeout,
        worker_init_fn=data_loader.worker_init_fn,
        multiprocessing_context=data_loader.multiprocessing_context,
        prefetch_factor=data_loader.prefetch_factor,
        persistent_workers=data_loader.persistent_workers,
    )
