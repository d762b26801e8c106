"""Canary users for user-level sampling: k held-out records sharing one secret label each.

Under user-level sampling (:mod:`opacus_lastiterate.user_samplers`) the unit that a
neighbouring dataset adds or removes is a user with all its records, so the canaries of a
one-run audit (Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run*,
arXiv 2305.08846) are users too. :func:`make_canary_users` makes M of them: canary user j
owns k held-out records chosen by the caller (examples not otherwise in the training set),
all relabelled with one secret label drawn uniformly from the classes; one fair coin per
user decides whether all k records join the training users, as one more user, or all stay
out. The record is an :class:`~opacus_lastiterate.auditing.input_space.canary_set.InputCanaries`
whose features carry a records axis, shape ``(M, k, ...)``; its
:meth:`~opacus_lastiterate.auditing.input_space.canary_set.InputCanaries.scores` gives each
canary user minus the final model's summed (or mean) loss over its k records, so that
:class:`~opacus_lastiterate.callbacks.InTrainingCanaryAudit` (``input_canaries=``) audits
users without a hand-written ``input_loss``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Literal

import numpy as np
import torch
from numpy.typing import ArrayLike
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, TensorDataset

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.auditing.input_space.canary_set import InputCanaries, fair_coins
from opacus_lastiterate.user_samplers import UserDataset

__all__ = ["make_canary_users"]

CANARY_USER_COIN_SALT = 8
"""The ``salt`` of the canary users' coins in :func:`fair_coins` (input canaries use 2,
gradient canaries 3, text canaries 5)."""

_SECRET_KEY = 7  # spawn key of the secret labels
_REDUCTIONS = ("sum", "mean")


def _canary_user_id(index: int) -> tuple[str, int]:
    return ("canary user", index)


def _record_pair(item: object, name: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise TypeError(
            f"`{name}` must hold (features, label) records, got {type(item).__name__} at {index}."
        )
    return torch.as_tensor(item[0]), torch.as_tensor(item[1])


def _check_map_dataset(name: str, data: object) -> int:
    if isinstance(data, IterableDataset) or not hasattr(data, "__getitem__"):
        raise TypeError(f"`{name}` must be a map-style data set, got {type(data).__name__}.")
    try:
        return len(data)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"`{name}` must be a map-style data set with a length.") from None


def _check_indices(indices: ArrayLike, n_source: int) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.ndim != 2 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise TypeError(
            "`indices` must be a 2-D integer array (canary users, records), got "
            f"{idx.dtype} of shape {idx.shape}."
        )
    if idx.shape[0] < 1 or idx.shape[1] < 1:
        raise ValueError(f"`indices` must hold at least one user of one record, got {idx.shape}.")
    idx = idx.astype(np.int64)
    if idx.min() < 0 or idx.max() >= n_source:
        raise ValueError(f"`indices` must lie in [0, {n_source}), the records of `source`.")
    if np.unique(idx).size != idx.size:
        raise ValueError("`indices` must be distinct: a record belongs to one canary user.")
    return idx


def make_canary_users(
    train: Dataset,
    user_ids: Sequence[Hashable],
    source: Dataset,
    indices: ArrayLike,
    *,
    num_classes: int,
    seed: int,
    reduction: Literal["sum", "mean"] = "sum",
    max_records: int | None = None,
) -> tuple[UserDataset, InputCanaries]:
    """The training users joined by the canary users its coins include, and their record.

    Canary user j owns the records ``source[i]`` for ``i`` in ``indices[j]`` (``indices``
    of shape (M, k), distinct; ``source`` holds examples *not* in ``train``, e.g. a
    held-out split, and its labels are not used), all labelled with user j's secret, a
    class drawn uniformly from ``[0, num_classes)``. A fair coin per user (``fair_coins(seed,
    M, salt=8)``) adds its k records to the training data as one new user, with id
    ``("canary user", j)``, or leaves them all out. The secrets come from
    ``default_rng(SeedSequence(seed, spawn_key=(7,)))``; the global random number
    generators are not used.

    Args:
        train: the training records, a map-style data set of ``(features, label)`` pairs.
        user_ids: the user of each record of ``train``, as for
            :class:`~opacus_lastiterate.user_samplers.UserDataset`.
        source: held-out ``(features, label)`` records, each feature of the training
            records' shape; the canary users' records are cast to the training records'
            dtype.
        indices: (M, k) integer array: the records of each canary user in ``source``.
        num_classes: the number of classes the secrets are drawn from.
        seed: seed of the secrets and the coins.
        reduction: a canary user's loss, ``"sum"`` or ``"mean"`` of its records' losses
            (the reduction of the training loss, as in
            :func:`~opacus_lastiterate.user_samplers.per_user_loss`); its score is minus it.
        max_records: the :class:`~opacus_lastiterate.user_samplers.UserDataset` cap (None:
            the largest user); at least k, so that a canary user is trained on all the
            records it is scored on.

    Returns:
        ``(UserDataset(ConcatDataset([train, included records]), user ids, max_records),
        InputCanaries)``, the canary users after the training users, in order; the record's
        ``features`` have shape ``(M, k, ...)`` and ``source_indices`` is ``indices``.

    Raises:
        TypeError, ValueError: naming the offending argument.
    """
    n_train = _check_map_dataset("train", train)
    n_source = _check_map_dataset("source", source)
    if n_train == 0:
        raise ValueError("`train` must hold at least one record.")
    if isinstance(user_ids, (str, bytes)) or not hasattr(user_ids, "__iter__"):
        raise TypeError(f"`user_ids` must be a sequence, got {type(user_ids).__name__}.")
    ids = user_ids.tolist() if hasattr(user_ids, "tolist") else list(user_ids)
    if len(ids) != n_train:
        raise ValueError(f"`user_ids` must have one entry per record ({n_train}), got {len(ids)}.")
    idx = _check_indices(indices, n_source)
    m, k = idx.shape
    c = check_int("num_classes", num_classes, minimum=2)
    s = check_int("seed", seed)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"`reduction` must be 'sum' or 'mean', got {reduction!r}.")
    if max_records is not None and check_int("max_records", max_records, minimum=1) < k:
        raise ValueError(
            f"`max_records` must be at least the canary users' {k} records, got {max_records}."
        )
    new_ids = [_canary_user_id(j) for j in range(m)]
    try:
        taken = set(ids) & set(new_ids)
    except TypeError:
        raise TypeError("`user_ids` must hold hashable values.") from None
    if taken:
        raise ValueError(f"`user_ids` must not use the canary users' ids, got {sorted(taken)}.")
    x0, y0 = _record_pair(train[0], "train", 0)
    xs = []
    for i in idx.reshape(-1):
        x, _ = _record_pair(source[int(i)], "source", int(i))
        if x.shape != x0.shape:
            raise ValueError(
                f"`source` record {int(i)} has features of shape {tuple(x.shape)}, the "
                f"training records {tuple(x0.shape)}."
            )
        xs.append(x.to(x0.dtype))
    features = torch.stack(xs).reshape(m, k, *x0.shape)
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(_SECRET_KEY,)))
    secrets = torch.from_numpy(rng.integers(0, c, size=m).astype(np.int64))
    coins = fair_coins(s, m, salt=CANARY_USER_COIN_SALT)
    canaries = InputCanaries(features, secrets, coins, idx, reduction=reduction)
    inside = np.flatnonzero(coins)
    keep = torch.from_numpy(inside)
    records = TensorDataset(
        features[keep].reshape(-1, *x0.shape),
        secrets[keep].repeat_interleave(k).to(y0.dtype),
    )
    owners = ids + [new_ids[j] for j in inside for _ in range(k)]
    users = UserDataset(ConcatDataset([train, records]), owners, max_records=max_records)
    return users, canaries
