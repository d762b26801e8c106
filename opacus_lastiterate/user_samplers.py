"""User-level sampling for PyTorch: batches of users, each user's records clipped together
(``docs/privacy_units.md``, "User-level sampling"; the unit is
:meth:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit.sampled_user`: the record-level
privacy of a dataset of U users, whatever the number of records a user owns).

Opacus clips per element of the batch dimension. :class:`UserDataset` makes a user one
element: item ``u`` stacks the records of user ``u`` along a second dimension, padded with
zeros to ``max_records`` rows, with a mask of the real rows; with layers that keep that
dimension, Opacus's per-sample gradient is the gradient of the user's loss, and
:func:`per_user_loss` reduces the per-record losses to one loss per user (padding rows weigh
0). :func:`user_data_loader` builds the loader over users, ``"poisson"`` (Opacus's
``DPDataLoader`` over the users) or ``"shuffled"`` (a fresh permutation each epoch, batches
of ``users_per_step``); pass it with ``make_private(..., poisson_sampling=False)`` (with
``True`` Opacus replaces it by Poisson over the users at rate 1 / ``len(loader)``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Literal

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.user_samplers", "torch"):
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

from opacus_lastiterate.analysis._validation import check_int

__all__ = ["UserDataset", "per_user_loss", "user_data_loader", "users_fetched"]

_SAMPLINGS = ("poisson", "shuffled")
_fetched = 0


def users_fetched() -> int:
    """How many users the data loaders of this process have fetched so far, over all user
    datasets (the batches of :meth:`UserDataset.__getitems__`, which a ``DataLoader``
    calls; a plain ``dataset[u]`` is not counted, nor are batches fetched in worker
    processes). The wiring check counts a step's users by difference
    (:mod:`opacus_lastiterate.auditing.wiring_users`)."""
    return _fetched


def _fields(item: Any) -> tuple[torch.Tensor, ...]:
    fields = tuple(item) if isinstance(item, (tuple, list)) else (item,)
    out = []
    for field in fields:
        tensor = field if isinstance(field, torch.Tensor) else torch.as_tensor(field)
        out.append(tensor)
    return tuple(out)


class UserDataset(Dataset):
    """The users of a record dataset: item ``u`` holds all records of user ``u``.

    Item ``u`` is a tuple: each field of the records (``dataset[i]`` is a tuple of tensors or
    numbers, or one tensor) stacked over the user's records into a tensor of shape
    ``(max_records, *field_shape)``, zero rows after the user's records, then the mask, a
    float tensor of shape ``(max_records,)``, 1 for a real record and 0 for padding. Every item
    has the same shapes, so the default collate function (and Opacus's empty batches) work.

    Args:
        dataset: a map-style dataset of records.
        user_ids: the user of each record (``len(dataset)`` hashable values). Users are
            numbered in order of their first record.
        max_records: the most records a user contributes (default: the largest user's count).
            A user with more keeps its first ``max_records`` records in dataset order; the
            others are not used (:attr:`dropped_records` counts them). Under user-level
            sampling the privacy does not depend on it; it bounds memory and a user's weight
            in the loss.

    Raises:
        TypeError, ValueError: naming the offending argument.
    """

    def __init__(
        self,
        dataset: Dataset,
        user_ids: Sequence[Hashable],
        *,
        max_records: int | None = None,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise TypeError(f"`dataset` must be a map-style dataset, got {dataset!r}.")
        try:
            size = len(dataset)  # type: ignore[arg-type]
        except TypeError as exc:
            raise TypeError(f"`dataset` must have a length, got {dataset!r}.") from exc
        if isinstance(user_ids, (str, bytes)) or not hasattr(user_ids, "__iter__"):
            raise TypeError(f"`user_ids` must be a sequence, got {user_ids!r}.")
        ids = user_ids.tolist() if hasattr(user_ids, "tolist") else list(user_ids)
        if len(ids) != size:
            raise ValueError(
                f"`user_ids` must have one entry per record ({size}), got {len(ids)}."
            )
        if size == 0:
            raise ValueError("`dataset` must hold at least one record.")
        members: dict[Hashable, list[int]] = {}
        for index, user in enumerate(ids):
            try:
                members.setdefault(user, []).append(index)
            except TypeError as exc:
                raise TypeError(
                    f"`user_ids` must hold hashable values, got {user!r} at {index}."
                ) from exc
        largest = max(len(m) for m in members.values())
        cap = largest if max_records is None else check_int("max_records", max_records, minimum=1)
        self.dataset = dataset
        self.max_records = cap
        self.users: tuple[Hashable, ...] = tuple(members)
        self._records = tuple(tuple(m[:cap]) for m in members.values())
        self.dropped_records = sum(max(0, len(m) - cap) for m in members.values())
        first = _fields(dataset[0])
        self._shapes = tuple((f.shape, f.dtype) for f in first)

    @property
    def num_users(self) -> int:
        """U, the number of users."""
        return len(self._records)

    def records_of(self, user: int) -> tuple[int, ...]:
        """The dataset indices of the records user number ``user`` contributes."""
        return self._records[user]

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, user: int) -> tuple[torch.Tensor, ...]:
        indices = self._records[user]
        stacked = [
            torch.zeros((self.max_records, *shape), dtype=dtype) for shape, dtype in self._shapes
        ]
        for row, index in enumerate(indices):
            for j, field in enumerate(_fields(self.dataset[index])):
                stacked[j][row] = field
        mask = torch.zeros(self.max_records)
        mask[: len(indices)] = 1.0
        return (*stacked, mask)

    def __getitems__(self, users: Sequence[int]) -> list[tuple[torch.Tensor, ...]]:
        """The items of ``users``, as a ``DataLoader`` fetches a batch; counted by
        :func:`users_fetched`."""
        global _fetched
        items = [self[user] for user in users]
        _fetched += len(items)
        return items


def per_user_loss(
    record_losses: torch.Tensor,
    mask: torch.Tensor,
    *,
    reduction: Literal["sum", "mean"] = "sum",
) -> torch.Tensor:
    """One loss per user from per-record losses of shape ``(users, max_records)``.

    ``"sum"``: the sum of the user's record losses (a user's clipped gradient is that of all
    its records together); ``"mean"``: their mean over the user's real records. Padding rows
    (mask 0) weigh 0 either way. Reduce the result over users with ``.mean()`` (Opacus's
    default ``loss_reduction="mean"``) or ``.sum()``.

    Raises:
        TypeError, ValueError: naming the offending argument.
    """
    if not isinstance(record_losses, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise TypeError("`record_losses` and `mask` must be torch tensors.")
    if record_losses.shape != mask.shape or record_losses.dim() != 2:
        raise ValueError(
            "`record_losses` must have the mask's shape (users, max_records), got "
            f"{tuple(record_losses.shape)} and {tuple(mask.shape)}."
        )
    if reduction not in ("sum", "mean"):
        raise ValueError(f"`reduction` must be 'sum' or 'mean', got {reduction!r}.")
    weights = mask.to(record_losses.dtype)
    total = (record_losses * weights).sum(dim=1)
    if reduction == "mean":
        total = total / weights.sum(dim=1).clamp(min=1.0)
    return total


def user_data_loader(
    dataset: UserDataset,
    *,
    users_per_step: int,
    sampling: Literal["poisson", "shuffled"] = "poisson",
    generator: torch.Generator | None = None,
    drop_last: bool = False,
    **loader_kwargs: Any,
) -> DataLoader:
    """A loader drawing batches of users of ``dataset`` (module docstring).

    Args:
        dataset: the users (:class:`UserDataset`).
        users_per_step: B, the (expected) number of users per step. ``"poisson"``: the
            sample rate is q = 1 / b with b = round(U / B) >= 1 steps per epoch, so that
            ``len(loader)`` = b and Opacus's recorded rate 1 / ``len(loader)`` is q;
            ``"shuffled"``: batches of exactly B users (the last one smaller unless
            ``drop_last``).
        sampling: ``"poisson"`` (Opacus's ``DPDataLoader`` over the users) or ``"shuffled"``.
        generator: the random generator of the sampler (None: torch's default).
        drop_last: shuffled only: drop the last, smaller batch of an epoch.
        loader_kwargs: other ``DataLoader`` arguments (``num_workers``, ``pin_memory``, ...).

    Raises:
        TypeError, ValueError: naming the offending argument.
    """
    if not isinstance(dataset, UserDataset):
        raise TypeError(f"`dataset` must be a UserDataset, got {dataset!r}.")
    users = check_int("users_per_step", users_per_step, minimum=1)
    if sampling not in _SAMPLINGS:
        raise ValueError(f"`sampling` must be one of {', '.join(_SAMPLINGS)}, got {sampling!r}.")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"`generator` must be a torch.Generator or None, got {generator!r}.")
    if not isinstance(drop_last, bool):
        raise TypeError(f"`drop_last` must be a bool, got {drop_last!r}.")
    forbidden = sorted({"batch_size", "shuffle", "sampler", "batch_sampler"} & set(loader_kwargs))
    if forbidden:
        raise ValueError(
            f"`loader_kwargs` must not set {', '.join(forbidden)}: the loader draws its users."
        )
    if users > dataset.num_users:
        raise ValueError(
            f"`users_per_step` must be at most the number of users ({dataset.num_users}), "
            f"got {users}."
        )
    if sampling == "poisson":
        if drop_last:
            raise ValueError("`drop_last` applies to sampling='shuffled' only.")
        from opacus.data_loader import DPDataLoader

        steps = max(1, round(dataset.num_users / users))
        return DPDataLoader(dataset, sample_rate=1.0 / steps, generator=generator, **loader_kwargs)
    return DataLoader(
        dataset,
        batch_size=users,
        shuffle=True,
        generator=generator,
        drop_last=drop_last,
        **loader_kwargs,
    )
