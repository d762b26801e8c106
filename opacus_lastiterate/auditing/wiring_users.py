"""The wiring check's user count: under user-level sampling, one per-sample gradient per user.

With user-level sampling (:mod:`opacus_lastiterate.user_samplers`) a batch element is a user,
a tensor of shape ``(records, ...)``, and the accountant reports the privacy of a user
because Opacus clips each batch element. A layer that sees the users' records as separate
examples (its input reshaped from ``(users, records, ...)`` to ``(users * records, ...)``, as
a ``Conv2d`` needs) gets per-sample gradients per *record*: Opacus then clips each record,
one user adds up to ``records * C`` to the step, and the user-level epsilon is wrong without
any error.

:class:`BatchSizes` is a forward pre-hook on the trained model that records the batch size
of each forward pass (the common first dimension of its tensor arguments: the number of
users when the model receives the loader's batch).
:func:`~opacus_lastiterate.user_samplers.users_fetched` counts the users that data loaders
fetched (in this process, not in worker processes). :func:`user_count_problems` compares,
for each parameter, the sizes of its per-sample gradients (one per backward pass) with both,
since the previous optimizer step: each size must be that of a forward pass, and their sum
at most the users fetched (this catches a batch flattened before the model is called).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from opacus_lastiterate._warn import warn
from opacus_lastiterate.exceptions import AuditWarning
from opacus_lastiterate.user_samplers import users_fetched

__all__ = []


def _first_dims(values: Iterable[Any]) -> set[int]:
    dims: set[int] = set()
    for value in values:
        if isinstance(value, Mapping):
            items = list(value.values())
        else:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, torch.Tensor) and item.dim() >= 1:
                dims.add(int(item.shape[0]))
    return dims


class BatchSizes:
    """Records the batch size of each forward pass of ``model`` (when given) that builds a
    graph (grad mode on): the first dimension shared by all its tensor arguments (top level,
    or one level inside a list, tuple or mapping), or None when they disagree or there is
    none; and counts the users fetched."""

    def __init__(self, model: nn.Module | None) -> None:
        self.sizes: list[int | None] = []
        self._fetched = users_fetched()
        self._handle = (
            None
            if model is None
            else model.register_forward_pre_hook(self._record, with_kwargs=True)
        )

    def _record(self, _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not torch.is_grad_enabled():
            return
        dims = _first_dims((*args, *kwargs.values()))
        self.sizes.append(dims.pop() if len(dims) == 1 else None)

    @property
    def hooked(self) -> bool:
        """Whether a model's forward passes are recorded."""
        return self._handle is not None

    def take(self) -> tuple[list[int | None], int]:
        """The sizes recorded and the users fetched since the last call (or since
        creation), and start again."""
        sizes, self.sizes = self.sizes, []
        now = users_fetched()
        fetched, self._fetched = now - self._fetched, now
        return sizes, fetched

    def remove(self) -> None:
        """Remove the hook."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.sizes = []


def user_count_problems(
    parts: dict[str, list[int]], users: list[int], fetched: int
) -> dict[str, str]:
    """The parameters whose per-sample gradients are not one per user.

    Args:
        parts: parameter name -> the number of per-sample gradients of each backward pass.
        users: the number of users of each forward pass of the model since the previous
            optimizer step (empty: not known).
        fetched: the user items fetched since the previous optimizer step
            (:func:`~opacus_lastiterate.user_samplers.users_fetched`; 0: not known).

    Returns:
        name -> why, for each parameter with a backward pass whose size is not that of a
        forward pass (each forward pass matched once), or with more per-sample gradients in
        all than users fetched.
    """
    available = Counter(users)
    problems = {}
    for name, sizes in parts.items():
        got = sizes[0] if len(sizes) == 1 else sizes
        if users and Counter(sizes) - available:
            held = users[0] if len(users) == 1 else users
            where = f"the model's input holds {held} users"
        elif fetched and sum(sizes) > fetched:
            where = f"the loader fetched {fetched} users since the previous step"
        else:
            continue
        problems[name] = (
            f"per-sample gradients for {got} examples where {where} (user-level sampling): "
            "its layer saw each user's records as separate examples (the batch reshaped "
            "from (users, records, ...) to (users * records, ...)), so Opacus clips each "
            "record and one user contributes up to records * C while the accountant reports "
            "one user's privacy. Keep the users first in this layer's input (a layer that "
            "reduces over the records dimension, e.g. a module holding its own parameters "
            "that reshapes inside its forward, which Opacus differentiates per user), or "
            "train with a record loader (the unit is then one record)"
        )
    return problems


def per_user_problems(
    parts: dict[str, list[int]], counts: tuple[list[int | None], int], *, hooked: bool
) -> dict[str, str] | None:
    """:func:`user_count_problems` with the counts :meth:`BatchSizes.take` returned (a
    forward pass without a common batch dimension voids the model's count), or None after
    :func:`warn_uncounted_users` when neither count is known (``hooked``: a model's forward
    passes were recorded)."""
    forwards, fetched = counts
    known = [] if None in forwards else [n for n in forwards if n is not None]
    if known or fetched:
        return user_count_problems(parts, known, fetched)
    warn_uncounted_users(
        "no forward pass of the model with a common batch dimension was seen, and no user "
        "was fetched by a data loader of this process since the previous step"
        if hooked
        else "no model was given, and no user was fetched by a data loader of this process "
        "since the previous step"
    )
    return None


def warn_uncounted_users(why: str) -> None:
    """The ``AuditWarning`` that the users of the batch could not be counted (``why``)."""
    warn(
        f"The wiring check cannot count the users of the batch ({why}): under user-level "
        "sampling it does not verify that Opacus clips users rather than records (pass the "
        "model to PrivacyMonitor.attach or check_private_training, with hook-based clipping).",
        AuditWarning,
    )
