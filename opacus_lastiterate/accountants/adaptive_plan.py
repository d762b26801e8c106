"""The adaptive optimizer a noise calibration plans for, and the caveat warning of an
adaptive run.

Opacus's ``make_private_with_epsilon`` calibrates the noise multiplier with a fresh accountant
created by name, whose history it assigns (``[(sigma, q, T)]``) and whose ``get_epsilon`` it
bisects on; that accountant never sees an optimizer. For an adaptive optimizer (Adam, AdamW,
...; ``docs/adaptive_optimizers.md``) the heuristic it should meet is the one with the
optimizer's frozen-second-moment weights, which depend on the optimizer's settings at every
step and on the noise they see, s_t = sigma C / B (clipping norm C, expected batch size B).
An :class:`AdaptivePlan` is those settings with C / B; within
:func:`adaptive_plan_of_new_accountants` a new
:class:`~opacus_lastiterate.accountants.LastIterateAccountant` takes the plan, and a history
assigned to it is answered with the planned weights at the history's noise multiplier
(:meth:`AdaptivePlan.runs`), through the accountant's kept model as a trained run is.
:func:`plan_for_calibration` builds the plan from ``make_private_with_epsilon``'s arguments.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.last_iterate.adaptive_columns import (
    AdaptiveColumns,
    adaptive_columns_caveats,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    AdaptiveStep,
    adaptive_run_caveats,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    ADAPTIVE_HEURISTIC_LABEL,
    AdaptiveSettings,
    canonical_adaptive_name,
    settings_from_param_group,
)
from opacus_lastiterate.analysis.run import TrainingSegment
from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning

__all__ = []

AdaptiveRuns = list[tuple[AdaptiveStep, int]]


@dataclass(frozen=True)
class AdaptivePlan:
    """The settings of a planned adaptive run, for calibration.

    Attributes:
        settings: one :class:`~opacus_lastiterate.analysis.last_iterate.adaptive_weights.
            AdaptiveSettings` per planned step, or a single one for every step.
        noise_scale: C / B > 0, the clipping norm over the expected batch size: the noise
            on one coordinate of the averaged gradient is sigma x ``noise_scale``.
    """

    settings: tuple[AdaptiveSettings, ...]
    noise_scale: float

    def __post_init__(self) -> None:
        settings = self.settings
        if isinstance(settings, AdaptiveSettings):
            settings = (settings,)
        if isinstance(settings, (str, bytes)) or not isinstance(settings, Sequence):
            raise TypeError(
                "`optimizer_settings` must be an AdaptiveSettings or a sequence of them (one "
                f"per planned step), got {type(self.settings).__name__}."
            )
        settings = tuple(settings)
        if not settings:
            raise ValueError("`optimizer_settings` must not be empty.")
        for i, s in enumerate(settings):
            if not isinstance(s, AdaptiveSettings):
                raise TypeError(f"`optimizer_settings[{i}]` must be an AdaptiveSettings, got {s!r}.")
        scale = check_in_interval("noise_scale", self.noise_scale, 0.0, math.inf)
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "noise_scale", scale)

    def check_steps(self, steps: int) -> None:
        """ValueError naming ``optimizer_settings`` unless the plan covers ``steps`` steps."""
        if len(self.settings) not in (1, steps):
            raise ValueError(
                f"`optimizer_settings` must hold one AdaptiveSettings, or one per step of the "
                f"planned run ({steps} steps), got {len(self.settings)}."
            )

    def runs(self, segments: Sequence[TrainingSegment]) -> AdaptiveRuns | None:
        """The recorded steps the plan gives the run of ``segments``: step t's settings with
        the noise std sigma_t x :attr:`noise_scale`, run-length encoded; None when the plan
        does not cover the run (another number of steps), or a step has no noise."""
        steps = sum(s.steps for s in segments)
        if steps == 0 or len(self.settings) not in (1, steps):
            return None
        if any(s.noise_multiplier == 0.0 for s in segments if s.steps):
            return None
        runs: AdaptiveRuns = []
        t = 0
        for seg in segments:
            std = seg.noise_multiplier * self.noise_scale
            for k in range(seg.steps):
                settings = self.settings[0 if len(self.settings) == 1 else t + k]
                step = AdaptiveStep(settings, std)
                if runs and runs[-1][0] == step:
                    runs[-1] = (step, runs[-1][1] + 1)
                else:
                    runs.append((step, 1))
            t += seg.steps
        return runs


_NEW_ACCOUNTANT_PLAN: contextvars.ContextVar[AdaptivePlan | None] = contextvars.ContextVar(
    "opacus_lastiterate_new_accountant_adaptive_plan", default=None
)


@contextmanager
def adaptive_plan_of_new_accountants(plan: AdaptivePlan | None) -> Iterator[None]:
    """Within this block, a new ``LastIterateAccountant`` answers a history assigned to it
    with the weights of ``plan`` (None: no plan, the constant-rate formula)."""
    if plan is not None and not isinstance(plan, AdaptivePlan):
        raise TypeError(f"`plan` must be an AdaptivePlan or None, got {type(plan).__name__}.")
    token = _NEW_ACCOUNTANT_PLAN.set(plan)
    try:
        yield
    finally:
        _NEW_ACCOUNTANT_PLAN.reset(token)


def planned_adaptive() -> AdaptivePlan | None:
    """The plan a new accountant takes now (:func:`adaptive_plan_of_new_accountants`)."""
    return _NEW_ACCOUNTANT_PLAN.get()


def plan_for_calibration(
    *,
    optimizer: Any,
    optimizer_settings: Any,
    data_loader: Any,
    max_grad_norm: Any,
    steps: int,
) -> AdaptivePlan | None:
    """The plan of ``make_private_with_epsilon``'s run (module docstring).

    The settings are ``optimizer_settings`` when given (an ``AdaptiveSettings`` for every
    step, or one per step of the planned run: a learning-rate schedule, betas or weight
    decay that change); otherwise, for an adaptive ``optimizer``, the settings its parameter
    groups hold now, assumed for every step (a scheduler attached later is not seen:
    only its first learning rate is); otherwise (SGD, or any other optimizer) None. The noise
    scale is ``max_grad_norm`` (the norm of the per-layer thresholds) over Opacus's expected
    batch size, ``int(len(data_loader.dataset) / len(data_loader))`` (one process).

    Raises:
        TypeError, ValueError: ``optimizer_settings`` malformed or not covering ``steps``,
            an adaptive optimizer whose parameter groups differ or hold ``maximize=True``.
    """
    if optimizer_settings is None:
        inner = getattr(optimizer, "original_optimizer", optimizer)
        try:
            canonical_adaptive_name(inner)
        except ValueError:
            return None  # SGD (its calibration is the constant-rate one) or unsupported
        groups = [settings_from_param_group(inner, g) for g in inner.param_groups]
        if any(g != groups[0] for g in groups[1:]):
            raise ValueError(
                "`optimizer` has parameter groups with different settings: pass "
                "`optimizer_settings` (the settings to calibrate for) to make_private_with_epsilon."
            )
        optimizer_settings = groups[0]
    if isinstance(max_grad_norm, (list, tuple)):
        clip = math.sqrt(sum(float(c) ** 2 for c in max_grad_norm))
    else:
        clip = float(max_grad_norm)
    batch = int(len(data_loader.dataset) * (1 / len(data_loader)))  # Opacus's expression
    if batch < 1:
        raise ValueError("`data_loader` gives an expected batch size below 1.")
    plan = AdaptivePlan(optimizer_settings, clip / batch)
    plan.check_steps(steps)
    return plan


def warn_adaptive_caveats(
    runs: AdaptiveRuns | AdaptiveColumns, segments: Sequence[TrainingSegment], steps: int
) -> None:
    """Warn (:class:`~opacus_lastiterate.exceptions.AdaptiveHeuristicWarning`) when the
    adaptive run ``runs`` over ``segments`` lies outside the settings where its heuristic
    was checked against simulation (:func:`~opacus_lastiterate.analysis.last_iterate.
    adaptive_steps.adaptive_run_caveats`); nothing inside them."""
    sigma = [s.noise_multiplier for s in segments]
    q = [s.sample_rate for s in segments]
    caveats = (
        adaptive_columns_caveats(runs, sigma, q) if isinstance(runs, AdaptiveColumns)
        else adaptive_run_caveats(runs, sigma, q)
    )  # fmt: skip
    if caveats:
        warn(
            f"The {ADAPTIVE_HEURISTIC_LABEL} epsilon of this run (at step {steps}) is outside "
            "the settings where it was checked against simulation "
            "(docs/adaptive_optimizers.md): " + " ".join(caveats) + " (Warned once per run.)",
            AdaptiveHeuristicWarning,
        )
