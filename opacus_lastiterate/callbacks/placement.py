"""Where a :class:`~opacus_lastiterate.callbacks.monitor.PrivacyMonitor` computes its
records: on the training thread or in a separate process (its ``evaluation`` argument;
``docs/callbacks.md``, "Where the records are computed").

``"inline"`` evaluates on the training thread
(:class:`~opacus_lastiterate.callbacks.evaluator.InlineEvaluator`), ``"process"`` in a child
process from the start (``ProcessEvaluator``,
:mod:`opacus_lastiterate.callbacks._evaluation_process`). ``"auto"`` starts inline and moves
the evaluation to a process once the weighted heuristic of the waiting steps no longer fits
in the monitor's overhead budget, when there is a second core for it, no privacy budget
(whose guard needs each step's value on the training thread) and at least
:data:`OFFLOAD_AFTER` of training: a process takes seconds to start, and at the end of
training one that has not started yet is not waited for (its steps are evaluated inline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.callbacks._evaluation_process import ProcessEvaluator, usable_cores
from opacus_lastiterate.callbacks.cadence import Cadences, OverheadBudget
from opacus_lastiterate.callbacks.evaluator import Evaluator, InlineEvaluator
from opacus_lastiterate.callbacks.records import EpsilonRecord

__all__ = ["OFFLOAD_AFTER", "Evaluation", "EvaluatorPlacement", "check_evaluation"]

Evaluation = Literal["auto", "inline", "process"]
"""Where the records are computed (module docs)."""

OFFLOAD_AFTER = 1.0
"""Seconds of training before ``"auto"`` moves the evaluation to a process (one takes
seconds to start: a run that has trained for less is likely to end before it has)."""


def check_evaluation(value: object) -> Evaluation:
    """A validated ``evaluation``."""
    if value not in ("auto", "inline", "process"):
        raise ValueError(f"`evaluation` must be 'auto', 'inline' or 'process', got {value!r}.")
    return value  # type: ignore[return-value]


class EvaluatorPlacement:
    """A monitor's choice of evaluator, and its move from the training thread to a process
    under ``"auto"`` (module docs)."""

    def __init__(self, evaluation: Evaluation) -> None:
        self.evaluation = evaluation
        self.offloaded = evaluation == "process"
        """Whether new evaluators are process evaluators."""
        self.may_offload = evaluation == "auto" and usable_cores() >= 2
        """Whether the evaluation may still move to a process."""

    def make(
        self, accountant: Any, *, delta: float, cadences: Cadences, corrected: Any,
        own_corrected: bool, overhead: OverheadBudget, dropped: int,
        rdp: Sequence[float] | np.ndarray | None, last_lr: float | None,
    ) -> Evaluator:
        """An evaluator at the accountant's state less its last ``dropped`` steps (a process
        evaluator is given the corrected accountant only when the monitor feeds it:
        ``own_corrected``)."""
        process = self.offloaded
        evaluator = ProcessEvaluator if process else InlineEvaluator
        return evaluator(  # type: ignore[no-any-return]
            accountant, delta=delta, cadences=cadences,
            corrected=None if process and not own_corrected else corrected,
            overhead=overhead, dropped=dropped, rdp=rdp, last_lr=last_lr,
        )  # fmt: skip

    def offload_pays(
        self, accountant: Any, cadences: Cadences, overhead: OverheadBudget, steps: int,
        guarded: bool,
    ) -> bool:
        """Whether to move the evaluation to a process now: the weighted heuristic of
        ``steps`` waiting steps does not fit in ``overhead`` after ``OFFLOAD_AFTER`` of
        training (``guarded``: a privacy budget is set, so never)."""
        return (
            self.may_offload
            and not guarded
            and cadences.weighted_every == "auto"
            and isinstance(accountant, LastIterateAccountant)
            and accountant.uses_weights
            and overhead.training >= OFFLOAD_AFTER
            and not overhead.fits("weighted", steps)
        )

    def offload(self) -> None:
        """New evaluators evaluate in a process from now on."""
        self.offloaded, self.may_offload = True, False

    def settle_at_end(self, evaluator: Evaluator) -> list[EpsilonRecord] | None:
        """At the end of training (``"auto"``): if ``evaluator``'s process is still starting,
        stop it and evaluate inline from now on; the records of the steps it had (else
        None)."""
        if self.evaluation != "auto" or not isinstance(evaluator, ProcessEvaluator):
            return None
        records = evaluator.evaluate_inline_unless_started()
        if records is not None:
            self.offloaded = self.may_offload = False
        return records

    def back_inline(self) -> bool:
        """Under ``"auto"``, evaluate inline again (a privacy budget was set); whether the
        evaluation was in a process."""
        moved = self.evaluation == "auto" and self.offloaded
        if moved:
            self.offloaded = False
        return moved
