"""A privacy budget for the monitor, and the guard that enforces it exactly and cheaply.

:class:`PrivacyBudget` says which epsilon must stay within which limit, and what happens to
the step that would exceed it. :class:`BudgetGuard` decides, for each step as it is taken,
whether it is within the budget without evaluating every step: a step is allowed at once
when a certified upper bound is within the limit (the RDP standard epsilon, which bounds
every heuristic, and for the constant-rate heuristic the shifted-count bound of
:mod:`~opacus_lastiterate.analysis.last_iterate.budget_horizon`; both are computed for many
steps ahead and recomputed only when the settings change or the horizon is used up);
otherwise the step's own value must be computed and decides.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opacus_lastiterate.analysis.last_iterate.budget_horizon import steps_within_limit
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.callbacks.evaluator import InlineEvaluator, QueuedStep
from opacus_lastiterate.callbacks.records import EpsilonRecord
from opacus_lastiterate.exceptions import PrivacyBudgetExceededError

__all__ = [
    "PrivacyBudget",
]

BudgetMetric = Literal["heuristic_epsilon", "robust_heuristic_epsilon", "opacus_rdp_epsilon"]
BUDGET_METRICS: tuple[str, ...] = (
    "heuristic_epsilon",
    "robust_heuristic_epsilon",
    "opacus_rdp_epsilon",
)
"""The record fields a :class:`PrivacyBudget` can limit."""


@dataclass(frozen=True)
class PrivacyBudget:
    """Stop before the step that would push ``metric`` past ``epsilon``.

    Args:
        epsilon: the limit, > 0. A step is allowed if its epsilon is <= the limit.
        metric: ``"heuristic_epsilon"`` (default), ``"robust_heuristic_epsilon"`` or
            ``"opacus_rdp_epsilon"`` (Opacus's RDP upper bound on the standard epsilon, so the
            tight PLD value is within budget too). The metric is evaluated at a step only
            when no certified bound already keeps it within the limit (module docs); near
            the limit that is every step (20-75 ms per robust evaluation at large T, one
            weighted solve per step under a schedule or momentum).
        action: ``"raise"``: :class:`PrivacyBudgetExceededError` from ``optimizer.step()``;
            ``"stop"``: the step is skipped (no update), ``PrivacyMonitor.should_stop``
            becomes True and every later step is skipped too (the adapters turn this into
            ``trainer.should_stop`` / ``control.should_training_stop``).
    """

    epsilon: float
    metric: BudgetMetric = "heuristic_epsilon"
    action: Literal["raise", "stop"] = "raise"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.epsilon, numbers.Real)
            or isinstance(self.epsilon, bool)
            or not (self.epsilon > 0)
        ):
            raise ValueError(f"`epsilon` must be a real number > 0, got {self.epsilon!r}.")
        if self.metric not in BUDGET_METRICS:
            raise ValueError(f"`metric` must be one of {BUDGET_METRICS}, got {self.metric!r}.")
        if self.action not in ("raise", "stop"):
            raise ValueError(f"`action` must be 'raise' or 'stop', got {self.action!r}.")


_RDP_BLOCK = (256, 8192)  # first and largest number of steps the RDP horizon looks ahead
_BOUND_STEPS = 4096  # the most steps one shifted-count bound certifies
_BOUND_RETRY = 16  # steps of exact checks before the shifted-count bound is tried again
_SLACK = 1e-6  # relative margin between a certified bound and the limit


class BudgetGuard:
    """Whether a step is certified within a :class:`PrivacyBudget` by a bound (module docs).

    Args:
        budget: the budget.
        delta: the monitor's delta.
    """

    def __init__(self, budget: PrivacyBudget, delta: float) -> None:
        self.budget = budget
        self.delta = delta
        self.reset()

    def reset(self) -> None:
        """Forget the horizons (after a step was taken back or the state replaced)."""
        self._rdp_horizon: tuple[tuple[float, float], int] | None = None
        self._rdp_block = _RDP_BLOCK[0]
        self._rdp_spent = False  # the RDP bound exceeded the limit (it never comes back)
        self._bound_horizon: tuple[SGDSettings | None, int] | None = None
        self._bound_retry_at = 0
        self._bound_start = 16

    def certifies(
        self, entry: QueuedStep, queue: list[QueuedStep], evaluator: InlineEvaluator
    ) -> bool:
        """Whether a bound keeps ``entry`` (the last of ``queue``, the steps not evaluated
        yet) within the budget."""
        step, sigma, q, _, settings = entry
        if evaluator.epoch_sampling:  # the bounds below are Poisson's: evaluate the step
            return False
        if not evaluator.unit.single_record:  # ... and one record's
            return False
        if self._rdp_allows(step, sigma, q, queue, evaluator):
            return True
        return self.budget.metric == "heuristic_epsilon" and self._bound_allows(
            step, sigma, settings, queue, evaluator
        )

    def check(
        self,
        entry: QueuedStep,
        queue: list[QueuedStep],
        evaluator: InlineEvaluator,
        out: list[EpsilonRecord],
    ) -> tuple[bool, PrivacyBudgetExceededError | None]:
        """Decide ``entry``, the last of ``queue`` (the steps not evaluated yet).

        Returns:
            ``(False, None)`` when a bound certifies it (nothing evaluated); otherwise
            ``(True, refusal)``: the records of ``queue`` were appended to ``out``
            (``entry``'s own value decides) and, if that value exceeds the limit, ``refusal``
            is the error that refuses it: ``entry``'s record is then dropped and the step
            taken back from ``evaluator`` (the caller takes it back from the accountants).
        """
        if self.budget.metric == "robust_heuristic_epsilon" and not evaluator.unit.single_record:
            raise ValueError(  # checked before anything is evaluated
                f"`budget.metric` 'robust_heuristic_epsilon' has no model for the privacy unit "
                f"{evaluator.unit.code()!r}; limit 'heuristic_epsilon' instead."
            )
        if self.certifies(entry, queue, evaluator):
            return False, None
        budget = self.budget
        evaluator.evaluate(queue, need=budget.metric, out=out)
        value = getattr(out[-1], budget.metric)
        if not value > budget.epsilon:
            return True, None
        out.pop()
        evaluator.take_back_last()
        self.reset()
        step = entry[0]
        message = (
            f"PrivacyMonitor: step {step} would bring {budget.metric} to {value:.6g} > the "
            f"budget {budget.epsilon:g} at delta={self.delta:g}; the step was not taken (the "
            f"model and accountant are as after step {step - 1})."
        )
        refusal = PrivacyBudgetExceededError(
            message, step=step, metric=budget.metric, value=value, limit=budget.epsilon
        )
        return True, refusal

    def _rdp_limit(self, evaluator: InlineEvaluator) -> float:
        """The RDP epsilon that certifies the budget: the limit itself for the RDP metric;
        below it by the weighted heuristic's accuracy (its values are rounded up by at most
        that) and a margin for the heuristics, which the RDP standard epsilon bounds (the
        final model is a post-processing of all iterates)."""
        limit = self.budget.epsilon
        if self.budget.metric == "opacus_rdp_epsilon":
            return limit
        return limit * (1.0 - evaluator.weight_accuracy) * (1.0 - _SLACK)

    def _rdp_allows(
        self,
        step: int,
        sigma: float,
        q: float,
        queue: list[QueuedStep],
        evaluator: InlineEvaluator,
    ) -> bool:
        """Whether the RDP bound certifies ``step`` (O(1) inside the horizon)."""
        if self._rdp_spent:
            return False
        horizon = self._rdp_horizon
        if horizon is not None and horizon[0] == (sigma, q) and step <= horizon[1]:
            return True
        queued = [(s, qq) for _, s, qq, _, _ in queue]
        eps = evaluator.rdp.lookahead(queued, self._rdp_block, (sigma, q), self.delta)
        over = np.flatnonzero(~(eps <= self._rdp_limit(evaluator)))
        safe = int(over[0]) if over.size else eps.size  # rows 0..safe-1 are within the limit
        end = evaluator.evaluated + safe
        if not over.size:
            self._rdp_block = min(2 * self._rdp_block, _RDP_BLOCK[1])
        if step > end:
            self._rdp_spent = True
            return False
        self._rdp_horizon = ((sigma, q), end)
        return True

    def _bound_allows(
        self,
        step: int,
        sigma: float,
        settings: SGDSettings | None,
        queue: list[QueuedStep],
        evaluator: InlineEvaluator,
    ) -> bool:
        """Whether the shifted-count bound certifies ``step`` for the constant-rate
        heuristic (:mod:`~opacus_lastiterate.analysis.last_iterate.budget_horizon`)."""
        horizon = self._bound_horizon
        if horizon is not None and horizon[0] == settings and sigma > 0 and step <= horizon[1]:
            return True
        if evaluator.replica is None or step < self._bound_retry_at or evaluator.evaluated == 0:
            return False
        if not all(s > 0 and st == settings for _, s, _, _, st in queue):
            return False
        if not evaluator.stays_constant_rate(settings):
            return False
        m = steps_within_limit(
            [tuple(h) for h in evaluator.history],
            self.delta,
            self.budget.epsilon,
            _BOUND_STEPS,
            start=self._bound_start,
        )
        end = evaluator.evaluated + m
        if step > end:
            self._bound_retry_at = step + _BOUND_RETRY
            self._bound_horizon = None
            return False
        self._bound_start = max(1, m)
        self._bound_horizon = (settings, end)
        return True
