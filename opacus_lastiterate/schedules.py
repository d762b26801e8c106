"""Learning rates and SGD settings read from real torch optimisers and schedulers.

The mathematics (weights from rates and momentum) is in
:mod:`opacus_lastiterate.analysis.last_iterate.optimizer_weights`; this module only runs torch objects:

* :func:`record_schedule` runs a
  ``torch.optim.lr_scheduler`` for T steps on a throw-away one-parameter SGD optimiser and
  records ``param_groups[i]["lr"]`` (and ``"momentum"``) before each step, so nothing of the
  user's training state is touched;
* :func:`sgd_settings` reads momentum, dampening, nesterov and weight decay from an
  optimiser's ``param_groups`` (an Opacus ``DPOptimizer`` is looked through) and raises
  :class:`~opacus_lastiterate.analysis.last_iterate.optimizer_weights.UnsupportedOptimizerError` for
  adaptive optimisers (Adam, AdamW, Adagrad, ...), whose weights come from
  :func:`adaptive_step` instead;
* :func:`adaptive_step` reads the settings of an adaptive optimiser (Adam, AdamW, NAdam,
  RAdam, Adamax, RMSprop, Adagrad) and the noise of an Opacus ``DPOptimizer``: the record of
  one step from which the frozen-second-moment weights are made
  (:mod:`opacus_lastiterate.analysis.last_iterate.adaptive_steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.schedules", "torch"):
    import torch

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    canonical_adaptive_name,
    settings_from_param_group,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    SGDSettings,
    check_optimizer_supported,
)
from opacus_lastiterate.exceptions import OpacusLastIterateWarning

__all__ = [
    "SGDSettings",
]

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


@dataclass(frozen=True)
class RecordedSchedule:
    """Learning rate and momentum in force at each of T optimiser steps."""

    learning_rates: np.ndarray
    momenta: np.ndarray


def record_schedule(
    make_scheduler: SchedulerFactory,
    steps: int,
    *,
    lr: float = 1.0,
    momentum: float = 0.0,
    interval: int = 1,
    group: int = 0,
) -> RecordedSchedule:
    """Run a torch scheduler for T steps on a throw-away SGD and record lr and momentum.

    Args:
        make_scheduler: called with a fresh ``torch.optim.SGD`` (one scalar parameter,
            learning rate ``lr``, momentum ``momentum``) and returning the scheduler, e.g.
            ``lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)``.
        steps: T, the number of optimiser steps.
        lr: the initial learning rate of the throw-away optimiser.
        momentum: its initial momentum (schedulers such as ``OneCycleLR`` cycle it).
        interval: optimiser steps per ``scheduler.step()`` (1: per step; the number of
            batches per epoch for a per-epoch scheduler).
        group: which parameter group to record (the factory may add groups).
    """
    n = check_int("steps", steps)
    every = check_int("interval", interval, minimum=1)
    param = torch.nn.Parameter(torch.zeros(()))
    optimizer = torch.optim.SGD([param], lr=float(lr), momentum=float(momentum))
    scheduler = make_scheduler(optimizer)
    if not (0 <= group < len(optimizer.param_groups)):
        raise ValueError(
            f"`group` must be in [0, {len(optimizer.param_groups) - 1}], got {group!r}."
        )
    rates, momenta = np.empty(n), np.empty(n)
    for t in range(n):
        rates[t] = float(optimizer.param_groups[group]["lr"])
        momenta[t] = float(optimizer.param_groups[group].get("momentum", 0.0))
        optimizer.step()  # no gradient: a no-op that keeps the scheduler's call-order check quiet
        if (t + 1) % every == 0:
            scheduler.step()
    return RecordedSchedule(rates, momenta)


def _unwrap(optimizer: Any) -> Any:
    inner = getattr(optimizer, "original_optimizer", None)
    return optimizer if inner is None else inner


def sgd_settings(optimizer: Any, *, group: int | None = None) -> SGDSettings:
    """Read (lr, momentum, dampening, nesterov, weight_decay) from an SGD optimiser.

    Args:
        optimizer: a ``torch.optim.SGD`` or an Opacus ``DPOptimizer`` wrapping one.
        group: the parameter group to read. None requires all groups to agree: with
            different settings per group the canary's direction decides which weights
            apply, and the worst case is the largest epsilon over the groups.

    Raises:
        UnsupportedOptimizerError: for adaptive or unknown optimisers.
        ValueError: if ``group`` is None and the groups differ.
    """
    inner = _unwrap(optimizer)
    check_optimizer_supported(inner)
    groups = _selected_groups(inner, group)

    def read(g: dict) -> SGDSettings:
        if g.get("maximize", False):
            warn(
                "`maximize=True` flips the sign of every weight; epsilon is unchanged.",
                OpacusLastIterateWarning,
            )
        return SGDSettings(
            lr=float(g["lr"]),
            momentum=float(g.get("momentum", 0.0)),
            dampening=float(g.get("dampening", 0.0)),
            nesterov=bool(g.get("nesterov", False)),
            weight_decay=float(g.get("weight_decay", 0.0)),
        )

    settings = [read(g) for g in groups]
    first = settings[0]
    if any(s != first for s in settings[1:]):
        raise ValueError(
            "`optimizer` has parameter groups with different SGD settings; pass `group=` to "
            "choose one (the worst case is the largest epsilon over the groups)."
        )
    return first


def is_adaptive(optimizer: Any) -> bool:
    """Whether ``optimizer`` (an Opacus ``DPOptimizer`` is looked through) is one of the
    adaptive optimisers with weights (:func:`adaptive_step`)."""
    try:
        canonical_adaptive_name(_unwrap(optimizer))
    except ValueError:
        return False
    return True


def refuse_maximize(optimizer: Any) -> None:
    """Raise a ValueError if a parameter group of an adaptive ``optimizer`` has
    ``maximize=True``: the adaptive weights describe a descent on the loss."""
    for i, g in enumerate(_unwrap(optimizer).param_groups):
        if g.get("maximize", False):
            raise ValueError(
                f"`maximize`=True (parameter group {i}) is not supported with "
                f"{type(_unwrap(optimizer)).__name__}: the last-iterate heuristic of adaptive "
                "optimizers describes a descent on the loss. Train with maximize=False "
                "(negate the loss instead)."
            )


def dp_noise_std(optimizer: Any) -> float:
    """sigma C / B of an Opacus ``DPOptimizer``: the standard deviation of the noise on one
    coordinate of the averaged gradient the wrapped optimiser sees (noise multiplier times
    ``max_grad_norm`` over the global expected batch size B).

    B is ``expected_batch_size``, times ``world_size`` for Opacus's distributed optimizers
    (``DistributedDPOptimizer`` and the others with a ``world_size``): their
    ``expected_batch_size`` is the per-rank one, and after each rank divides by it the
    all-reduce averages over the ranks, so the noise (added once, on rank 0) reaches the
    wrapped optimiser divided by the global B.

    Raises:
        ValueError: ``optimizer`` is not a ``DPOptimizer`` (it has no noise to read), or a
            value is out of range (named).
    """
    missing = [a for a in ("noise_multiplier", "max_grad_norm", "expected_batch_size")
               if getattr(optimizer, a, None) is None]  # fmt: skip
    if missing:
        raise ValueError(
            f"`optimizer` has no {', '.join(missing)}: the noise an adaptive optimiser sees "
            "is read from an Opacus DPOptimizer (make_private's optimizer)."
        )
    sigma = check_in_interval(
        "optimizer.noise_multiplier", optimizer.noise_multiplier, 0.0, float("inf"),
        low_open=False,
    )
    clip = check_in_interval("optimizer.max_grad_norm", optimizer.max_grad_norm, 0.0, float("inf"))
    batch = check_in_interval(
        "optimizer.expected_batch_size", optimizer.expected_batch_size, 0.0, float("inf")
    )
    world = getattr(optimizer, "world_size", None)
    if world is not None:
        if not isinstance(world, int) or isinstance(world, bool) or world < 1:
            raise ValueError(f"`optimizer.world_size` must be an integer >= 1, got {world!r}.")
        batch *= world
    return sigma * clip / batch


def adaptive_step(optimizer: Any, *, group: int | None = None) -> AdaptiveStep:
    """The :class:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.AdaptiveStep` of
    the coming step of an Opacus ``DPOptimizer`` wrapping an adaptive optimiser: its settings
    (:func:`~opacus_lastiterate.analysis.last_iterate.adaptive_weights.settings_from_param_group`)
    and noise (:func:`dp_noise_std`).

    Args:
        optimizer: the ``DPOptimizer``.
        group: the parameter group to read; None requires all groups to agree.

    Raises:
        UnsupportedOptimizerError: not an adaptive optimiser with weights.
        ValueError: ``maximize=True``, groups that differ, no noise to read (a plain
            optimiser, or a noise multiplier of 0), or a value out of range.
    """
    inner = _unwrap(optimizer)
    canonical_adaptive_name(inner)
    groups = _selected_groups(inner, group)
    settings = [settings_from_param_group(inner, g) for g in groups]
    if any(s != settings[0] for s in settings[1:]):
        raise ValueError(
            "`optimizer` has parameter groups with different settings; pass `group=` to "
            "choose one (the worst case is the largest epsilon over the groups)."
        )
    std = dp_noise_std(optimizer)
    if std == 0.0:
        raise ValueError(
            "`optimizer.noise_multiplier` is 0: without noise the adaptive weights are "
            "undefined (and epsilon is infinite)."
        )
    return AdaptiveStep(settings[0], std)


def _selected_groups(optimizer: Any, group: int | None) -> list[dict[str, Any]]:
    """The parameter groups a settings reader describes: all, or the one at index ``group``."""
    groups = list(optimizer.param_groups)
    if group is not None:
        if not (0 <= group < len(groups)):
            raise ValueError(f"`group` must be in [0, {len(groups) - 1}], got {group!r}.")
        groups = [groups[group]]
    return groups
