"""A framework-free privacy monitor for Opacus training: epsilon for every step.

:class:`PrivacyMonitor` attaches to an Opacus ``DPOptimizer`` (the one ``make_private``
returned) and produces one :class:`~opacus_lastiterate.callbacks.records.EpsilonRecord` per
optimizer step: the last-iterate heuristic (constant-rate or weighted), its robust maximum,
the standard epsilon by RDP (every step) and PLD, and a normalisation accountant's corrected
epsilon, each on its cadence and each labelled (:data:`LABELS`); the step's ``lr``,
``noise_multiplier`` and ``sample_rate``. Fields not computed at a step are ``None``.
Records go to *sinks* (:mod:`opacus_lastiterate.callbacks.sinks`) and to an optional
in-training audit; a :class:`PrivacyBudget` stops training *before* the step that would push
a chosen epsilon past a limit (``docs/callbacks.md``).

The monitor is assembled from objects, one module each: the records and their labels
(:mod:`~opacus_lastiterate.callbacks.records`), the cadences and the overhead budget of
``"auto"`` (:mod:`~opacus_lastiterate.callbacks.cadence`), the budget and its guard
(:mod:`~opacus_lastiterate.callbacks.budget`), and the evaluator
(:mod:`~opacus_lastiterate.callbacks.evaluator`).

Recording and evaluation are separate (``docs/callbacks.md``, "Cost"): on the training hot
path the monitor only queues the step's (step, sigma, q, lr, SGD settings), no epsilon and no
device synchronisation. The evaluator computes the records in batches at
:meth:`PrivacyMonitor.flush` (every ``flush_every`` steps, at :meth:`~PrivacyMonitor.state_dict`,
:meth:`~PrivacyMonitor.finish` and the adapters' epoch ends), on the training thread, by
replaying the queued steps into its own ``LastIterateAccountant``, so each logged value is the
one the accountant reports at that step.

How it hooks in: the monitor wraps the accountant's ``optimizer.step_hook`` (called by Opacus
inside ``DPOptimizer.pre_step``, after the noise and before the update: the accountant records
the step, then the monitor queues it and checks the budget) and the optimizer's ``step`` (a
due flush follows the update). A step refused by the budget is taken back from the accountant
and not applied. The monitor never reads a tensor. A change of the accountant it did not make
(a checkpoint loaded, another optimizer's steps) is followed from the accountant's state with
a ``MonitorWarning`` (:mod:`opacus_lastiterate.callbacks._following`); a sink that raises is
set aside with one warning (``SinkDispatch``). Under ``DistributedDPOptimizer`` create the
monitor on every rank: the histories, epsilons and budget decisions agree on every rank, and
the sinks are called on rank 0 only (``sink_rank``; ``docs/callbacks.md``, "Distributed
training").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants import LastIterateAccountant, RunAccountant, detect_sampling
from opacus_lastiterate.accountants.any_accountant import (
    accountant_of,
    last_step_of,
    steps_of,
    take_back_steps,
)
from opacus_lastiterate.accountants.engine_sampling import warn_about_detection
from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.auditing.wiring import WiringCheck, check_private_training
from opacus_lastiterate.callbacks._checkpoint import monitor_state, restore
from opacus_lastiterate.callbacks._following import AccountantWatch
from opacus_lastiterate.callbacks._optimizer_hooks import OptimizerHooks
from opacus_lastiterate.callbacks._optimizer_hooks import host_float as _host_float
from opacus_lastiterate.callbacks.budget import BudgetGuard, PrivacyBudget
from opacus_lastiterate.callbacks.cadence import (
    Cadence,
    Cadences,
    OverheadBudget,
    check_cadence,
    check_max_overhead,
)
from opacus_lastiterate.callbacks.evaluator import (
    NORMALISATION_ACCOUNTANTS,
    InlineEvaluator,
    QueuedStep,
    corrected_accountant_of,
)
from opacus_lastiterate.callbacks.records import (
    LABELS,
    EpsilonRecord,
    MonitorAudit,
    Sink,
)
from opacus_lastiterate.callbacks.sinks import SinkDispatch, check_sink_rank, process_rank
from opacus_lastiterate.exceptions import MonitorWarning

__all__ = [
    "LABELS",
    "EpsilonRecord",
    "MonitorAudit",
    "PrivacyBudget",
    "PrivacyMonitor",
]


# -- the monitor ----------------------------------------------------------------------------


class PrivacyMonitor:
    """Per-step privacy record of DP-SGD training (module docs).

    Args:
        accountant: the ``PrivacyEngine`` (its ``.accountant``) or the accountant that
            ``make_private`` attached to the optimizer. With a ``LastIterateAccountant`` the
            heuristic (and robust) epsilon is recorded; with ``"asgm"``/``"feasgm"`` its
            value is the corrected epsilon; with any other Opacus accountant only the
            standard epsilons.
        delta: target delta, in (0, 1).
        sinks: where records go: objects of :mod:`~opacus_lastiterate.callbacks.sinks` or
            any callable taking an :class:`EpsilonRecord`.
        heuristic_every: compute ``heuristic_epsilon`` every k steps while the accountant
            uses the constant-rate formula (and at :meth:`finish`); a :data:`Cadence`.
        weighted_every: the same while it uses the weighted heuristic (a learning-rate
            schedule, momentum or weight decay); default ``"auto"``: at every step of a flushed
            batch when the batch, solved together, fits in ``max_overhead`` (its last
            measured cost per step against the training time so far), else at its last step
            if that fits, and at the steps 100, 200, 400, ... whatever it costs; the other
            records have ``heuristic_epsilon`` None, so the log says which steps carry it
            (``docs/callbacks.md``, "Cost").
        robust_every: when to compute ``robust_heuristic_epsilon`` (a certified search, tens of ms
            at large T), besides :meth:`finish`; default ``"auto"``: at the steps 100, 200,
            400, ... (``"doubling"``) that fit in ``max_overhead``.
        standard_every: when to compute ``standard_epsilon`` and ``corrected_epsilon``
            (a PLD composition, 0.05-0.5 s), besides :meth:`finish`; default ``"auto"``.
        max_overhead: the ``"auto"`` cadences' budget, a fraction in (0, 1] of the wall
            time since :meth:`attach` (default 0.01): a robust or PLD value due at a
            doubling step, or a weighted heuristic at any step, is computed only when the
            time spent on such values, with its last cost, stays within it
            (``docs/callbacks.md``, "Cost"). Which steps carry them then depends on the
            machine's speed; the final record always does.
        flush_every: evaluate the queued steps and send their records to the sinks every k
            steps; None: only at :meth:`flush`, :meth:`state_dict`, :meth:`finish` and the
            adapters' epoch ends.
        corrected_accountant: a configured ``ASGMAccountant``/``FEASGMAccountant`` that the
            monitor feeds every step alongside ``accountant`` (through its own hook).
        budget: a :class:`PrivacyBudget`, or None for no limit.
        audit: an object with ``on_step(record)`` and ``finish()`` (:class:`MonitorAudit`),
            e.g. an in-training canary audit.
        optimizer: if given, :meth:`attach` to it now.
        check_wiring: at :meth:`attach`, arm the wiring check
            (:func:`~opacus_lastiterate.auditing.check_private_training`): the first step
            that adds noise verifies that every trainable parameter is privatised (per-sample
            gradients, clipping, noise scale, frozen parameters unchanged) and raises
            :class:`~opacus_lastiterate.exceptions.PrivacyWiringError` naming the ones that
            are not, before the step is accounted or applied. False: no check.
        sink_rank: under ``torch.distributed``, the rank whose process calls the sinks
            (default 0); the other ranks still account, build the records, check the budget
            and call the audit, identically. A process without an initialised process group
            counts as rank 0. None: call the sinks on every rank.
    """

    def __init__(
        self,
        accountant: object,
        *,
        delta: float,
        sinks: Iterable[Sink] = (),
        heuristic_every: Cadence = 1,
        weighted_every: Cadence = "auto",
        robust_every: Cadence = "auto",
        standard_every: Cadence = "auto",
        max_overhead: float = 0.01,
        flush_every: int | None = 100,
        corrected_accountant: object = None,
        budget: PrivacyBudget | None = None,
        audit: MonitorAudit | None = None,
        optimizer: object = None,
        check_wiring: bool = True,
        sink_rank: int | None = 0,
    ) -> None:
        self.accountant = accountant_of(accountant)
        self.delta = check_delta(delta)
        if not isinstance(check_wiring, bool):
            raise TypeError(f"`check_wiring` must be a bool, got {type(check_wiring).__name__}.")
        self.check_wiring = check_wiring
        self.wiring: WiringCheck | None = None
        """The armed wiring check (its ``report`` is set once the probe step passed)."""
        self.sinks: list[Sink] = []
        for i, sink in enumerate(sinks):
            if not callable(sink):
                raise TypeError(f"`sinks[{i}]` must be callable, got {type(sink).__name__}.")
            self.sinks.append(sink)
        self._dispatch = SinkDispatch(self.sinks)  # each sink fails alone
        self.sink_rank = check_sink_rank(sink_rank)
        self.cadences = Cadences(heuristic_every, weighted_every, robust_every, standard_every)
        self._overhead = OverheadBudget(check_max_overhead(max_overhead))
        self.flush_every = check_cadence("flush_every", flush_every, doubling=False)
        if corrected_accountant is not None and not isinstance(
            corrected_accountant, NORMALISATION_ACCOUNTANTS
        ):
            raise TypeError(
                "`corrected_accountant` must be an ASGMAccountant or FEASGMAccountant, got "
                f"{type(corrected_accountant).__name__}."
            )
        self._corrected: Any = corrected_accountant_of(self.accountant, corrected_accountant)
        self._own_corrected = self._corrected is not None and self._corrected is not self.accountant
        self._heuristic = isinstance(self.accountant, LastIterateAccountant)
        if audit is not None and not isinstance(audit, MonitorAudit):
            raise TypeError("`audit` must have on_step(record) and finish() methods.")
        self._guard: BudgetGuard | None = None
        self.budget = budget
        self.audit = audit
        self.audit_result: Any = None
        self.records_emitted = 0
        self._hooks = OptimizerHooks()  # the optimizer's wrapping; counts physical steps
        self.last_record: EpsilonRecord | None = None
        """The last record sent to the sinks (records are sent when they are flushed)."""
        self.should_stop = False
        """True once the budget refused a step (``action="stop"``)."""
        self.stop_reason: str | None = None
        self._was_attached = False
        self._evaluator: InlineEvaluator | None = None
        self._watch = AccountantWatch(self.accountant)  # a change it did not make
        self._sync()
        if optimizer is not None:
            self.attach(optimizer)

    @property
    def budget(self) -> PrivacyBudget | None:
        """The :class:`PrivacyBudget` (None: no limit); may be replaced between steps."""
        return None if self._guard is None else self._guard.budget

    @budget.setter
    def budget(self, budget: PrivacyBudget | None) -> None:
        if budget is not None and not isinstance(budget, PrivacyBudget):
            raise TypeError(f"`budget` must be a PrivacyBudget or None, got {budget!r}.")
        if budget is not None and budget.metric != "opacus_rdp_epsilon" and not self._heuristic:
            raise ValueError(
                f"`budget.metric` {budget.metric!r} needs a LastIterateAccountant; the "
                f"accountant is a {type(self.accountant).__name__} (use "
                "'opacus_rdp_epsilon')."
            )
        self._guard = None if budget is None else BudgetGuard(budget, self.delta)

    # the cadences, as attributes of their own (read-only: they are validated together)
    heuristic_every = property(lambda self: self.cadences.heuristic_every)
    weighted_every = property(lambda self: self.cadences.weighted_every)
    robust_every = property(lambda self: self.cadences.robust_every)
    standard_every = property(lambda self: self.cadences.standard_every)

    def _sync(self, rdp: Sequence[float] | None = None, dropped: int = 0) -> None:
        """Start evaluating from the accountant's current state less its last ``dropped``
        steps (no queued steps)."""
        last_lr = None if self.last_record is None else self.last_record.lr
        self._synced_sampling = getattr(self.accountant, "sampling", None)
        self._watch.mark()
        self._evaluator = self._make_evaluator(dropped, rdp, last_lr)
        self._final: tuple[int, EpsilonRecord | None] | None = None  # (steps, record) of finish()
        self._queue: list[QueuedStep] = []
        self._ready: list[EpsilonRecord] = []
        if self._guard is not None:
            self._guard.reset()

    def _make_evaluator(
        self, dropped: int, rdp: Sequence[float] | np.ndarray | None, last_lr: float | None
    ) -> InlineEvaluator:
        """An evaluator at the accountant's state less its last ``dropped`` steps."""
        return InlineEvaluator(
            self.accountant, delta=self.delta, cadences=self.cadences,
            corrected=self._corrected, overhead=self._overhead, dropped=dropped, rdp=rdp,
            last_lr=last_lr,
        )  # fmt: skip

    # -- attaching ------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's ``torch.distributed`` rank (0 without a process group)."""
        return process_rank()

    @property
    def calls_sinks(self) -> bool:
        """Whether this process calls the sinks (``sink_rank`` None or this rank)."""
        return self.sink_rank is None or process_rank() == self.sink_rank

    @property
    def attached(self) -> bool:
        """Whether the monitor is attached to an optimizer."""
        return self._hooks.optimizer is not None

    @property
    def optimizer(self) -> Any:
        """The ``DPOptimizer`` the monitor is attached to (None when detached)."""
        return self._hooks.optimizer

    @property
    def physical_steps(self) -> int:
        """``optimizer.step()`` calls seen while attached (virtual steps included)."""
        return self._hooks.physical_steps

    @physical_steps.setter
    def physical_steps(self, value: int) -> None:
        self._hooks.physical_steps = value

    @property
    def num_steps(self) -> int:
        """Steps recorded by the accountant (queued ones included)."""
        return steps_of(self.accountant)

    @property
    def pending(self) -> int:
        """Steps recorded whose records have not been sent to the sinks yet."""
        assert self._evaluator is not None
        return len(self._queue) + len(self._ready)

    def attach(self, optimizer: object, model: object = None) -> PrivacyMonitor:
        """Wrap the accountant's hook of an Opacus ``DPOptimizer`` (``make_private``'s), and
        arm the wiring check unless ``check_wiring`` is False (``model``: the trained module,
        for the check's coverage and frozen-parameter parts; without it those are skipped).

        Raises:
            TypeError: if ``optimizer`` is not a ``DPOptimizer``.
            ValueError: if it has no step hook (no accountant attached), its hook records
                into another accountant than the monitor's (another ``PrivacyEngine``'s), or
                the monitor is attached already.
        """
        if not self._hooks.check(optimizer, self.accountant):
            return self  # attached to it already
        assert self._evaluator is not None
        if not self._queue and (
            not self._watch.in_line(self._evaluator.evaluated)
            or self._synced_sampling != getattr(self.accountant, "sampling", None)
        ):
            self._sync()  # the accountant moved on (or make_private gave it its sampling)
        self._hooks.install(optimizer, self, self._on_pre_step, self._after_update)
        if self.check_wiring and self.wiring is None:
            self.wiring = check_private_training(
                optimizer, model, accountant=self.accountant  # type: ignore[arg-type]
            )
        self._was_attached = True
        self._overhead.restart()
        return self

    def observe_loader(self, data_loader: object) -> None:
        """Account the batches of ``data_loader``, the loader training really iterates (the
        adapters call it with the Hugging Face Trainer's and Lightning's train loaders, which
        are not the one ``make_private`` saw): its scheme is detected
        (:func:`~opacus_lastiterate.accountants.detect_sampling`, with the same warnings as
        at ``make_private``) and given to the accountant unless one was declared
        (``docs/samplers.md``), with the unit of its items (one user under user-level
        sampling, ``docs/privacy_units.md``); the evaluator restarts from the accountant's state if the
        scheme changed and no step is waiting."""
        detected = detect_sampling(data_loader)
        accountant = self.accountant
        if isinstance(accountant, RunAccountant):
            accountant.observe_sampling(detected.scheme)
            accountant.observe_unit(detected.unit)
            if accountant.sampling != self._synced_sampling and not self._queue:
                assert self._evaluator is not None
                self._sync(self._evaluator.rdp_vector.tolist())
        warn_about_detection(detected, accountant)

    def detach(self) -> None:
        """Flush, then undo :meth:`attach` (the accountant's hook is restored)."""
        if self._hooks.optimizer is None:
            return
        self.flush()
        self._hooks.remove()

    # -- per step: the hot path -------------------------------------------------------------

    def _on_pre_step(self, optim: Any) -> None:
        """The wrapped step hook: the accountant records the step, the monitor queues it
        and checks the budget. No epsilon is computed here unless the budget needs it."""
        if self.should_stop:
            self._hooks.skip_update = True
            return
        inner_hook = self._hooks.inner_hook
        assert inner_hook is not None
        inner_hook(optim)
        acc = self.accountant
        if not self._watch.in_line(self._seen() + 1):  # a change this monitor did not see
            self._watch.refuse_if_missed(self._seen())
            self._follow(recorded=1)
        sigma, q = last_step_of(acc)
        if self._own_corrected:  # what its own hook would record: the same (sigma, q)
            self._corrected.record_step(sigma, q, optimizer=optim)
        entry = (
            steps_of(acc),
            sigma,
            q,
            _host_float(optim.param_groups[0].get("lr")),
            acc.last_settings if self._heuristic else None,
        )
        self._queue.append(entry)
        self._hooks.mark(entry[0])
        if self._guard is not None:
            self._check_budget(entry)

    def _after_update(self) -> None:
        """After each update applied: flush when ``flush_every`` steps wait."""
        if self.flush_every is not None and self.pending >= self.flush_every:
            self.flush()

    # -- following the accountant (module _following) -------------------------------------

    def _seen(self) -> int:
        """The accountant's steps this monitor has seen (evaluated, sent or queued)."""
        assert self._evaluator is not None
        return self._evaluator.evaluated + len(self._queue)

    def _follow(self, recorded: int = 0) -> None:
        """If the accountant changed without this monitor (besides the ``recorded`` steps
        its hook has just added, queued by the caller): emit the records of the steps seen,
        warn, rewind the sinks if it went back, and restart from its state."""
        change = self._watch.change(self._seen(), recorded=recorded, attached=self.attached)
        if change is None:
            return
        self.flush()  # the records of the steps seen, of the state they were taken in
        self._watch.report(change)
        last = self.last_record
        if last is not None and last.step > change.steps and self.calls_sinks:
            self._dispatch.call("rewind", change.steps)  # the sinks go back with it
        if self._own_corrected:  # it is fed by this monitor: the same history
            self._watch.align(self._corrected, recorded)
        self._sync(dropped=recorded)

    # -- the budget guard -----------------------------------------------------------------

    def _check_budget(self, entry: QueuedStep) -> None:
        guard, evaluator = self._guard, self._evaluator
        assert guard is not None and isinstance(evaluator, InlineEvaluator)
        evaluated, refusal = guard.check(entry, self._queue, evaluator, self._ready)
        if evaluated:
            self._queue = []
        if refusal is None:
            return
        take_back_steps(self.accountant, 1)  # the step, undone everywhere
        self._watch.mark()  # a change this monitor made
        if self._own_corrected:
            self._corrected.take_back(1)
        self.stop_reason = str(refusal)
        if guard.budget.action == "raise":
            raise refusal
        self.should_stop = True
        self._hooks.skip_update = True

    # -- evaluation -----------------------------------------------------------------------

    def flush(self) -> None:
        """Compute the records of every recorded step and send them to the sinks (and the
        audit), in step order."""
        assert self._evaluator is not None
        queue, self._queue = self._queue, []
        self._evaluator.evaluate(queue, out=self._ready)  # each record kept as it is made
        ready, self._ready = self._ready, []
        for record in ready:
            self._emit(record)

    def _emit(self, record: EpsilonRecord) -> EpsilonRecord:
        physical = self._hooks.physical_steps_at(record.step)
        if physical is not None:
            record = dataclasses.replace(record, physical_steps=physical)
        self.last_record = record
        self.records_emitted += 1
        if self.calls_sinks:
            self._dispatch.send(record)  # a sink that fails is set aside, with a warning
        if self.audit is not None:
            self.audit.on_step(record)
        return record

    # -- end of training ------------------------------------------------------------------

    def finish(self) -> EpsilonRecord | None:
        """Flush, emit a final record with every epsilon (heuristic, robust, PLD,
        corrected) of the final model, call the audit's ``finish`` (its result in
        :attr:`audit_result`) and close the sinks that have a ``close`` method (on every
        rank, also those that ``sink_rank`` kept silent). Returns the final record (None
        before any step). A second call without new steps (an adapter may have finished
        already) returns the same record and emits nothing.

        A monitor sees only the steps taken while it is attached. When the accountant
        recorded steps that it did not see, the final record covers the steps it saw and a
        :class:`MonitorWarning` says so.

        Raises:
            RuntimeError: if the accountant recorded steps and the monitor saw none of them
                (it was never attached while training): nothing is emitted or closed then,
                and the message says how to attach it.
        """
        self._follow()
        evaluator = self._evaluator
        assert evaluator is not None
        seen = self._seen()
        unseen = steps_of(self.accountant) - seen
        if unseen > 0 and not seen:
            raise RuntimeError(
                f"PrivacyMonitor.finish(): the accountant recorded {unseen} step(s) and this "
                "monitor saw none of them, so it has nothing to report. Attach it before "
                "training: PrivacyMonitor(..., optimizer=optimizer) or "
                "monitor.attach(optimizer) (the adapters attach it themselves)."
            )
        self.flush()
        if unseen > 0:
            warn(
                f"PrivacyMonitor.finish(): the accountant recorded {unseen} step(s) that this "
                "monitor did not see (it was not attached while they were taken); its final "
                f"record covers the {seen} step(s) it saw, not the whole run.",
                MonitorWarning,
            )
        if self._final is not None and self._final[0] == evaluator.evaluated:
            return self._final[1]
        if not evaluator.evaluated and not self._was_attached:
            warn(
                "PrivacyMonitor.finish(): no step was recorded and the monitor was never "
                "attached to an optimizer, so it has nothing to report; pass "
                "optimizer=optimizer (or call monitor.attach(optimizer)) before training.",
                MonitorWarning,
            )
        record = None
        if evaluator.evaluated:
            record = self._emit(evaluator.final_record())
        if self.audit is not None:
            self.audit_result = self.audit.finish()
        self._dispatch.call("close", failed_too=True)
        self._final = (evaluator.evaluated, record)
        return record

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable state of plain Python values (JSON-serialisable): the
        accountant's history (Lightning and Hugging Face checkpoints do not save Opacus's
        accountant), the corrected accountant's, the RDP vector, the budget flag and the
        last record. Flushes first, so that the sinks hold every record up to the
        checkpoint."""
        self._follow()
        self.flush()
        evaluator = self._evaluator
        assert evaluator is not None
        covers = evaluator.evaluated == steps_of(self.accountant)  # no steps taken detached
        return monitor_state(
            accountant=self.accountant,
            corrected=self._corrected if self._own_corrected else None,
            rdp=evaluator.rdp_vector if covers else None,
            should_stop=self.should_stop,
            stop_reason=self.stop_reason,
            records_emitted=self.records_emitted,
            physical_steps=self.physical_steps,
            last_record=self.last_record,
        )

    def load_state_dict(self, state: Mapping[str, Any], *, rewind_sinks: bool = True) -> None:
        """Restore :meth:`state_dict` (the accountants' histories included); records queued
        and not yet flushed are dropped.

        Args:
            state: a :meth:`state_dict`.
            rewind_sinks: call ``rewind(step)`` on the sinks that have it (the JSONL and CSV
                sinks drop their records after the restored step), so that a run resumed
                from a checkpoint neither repeats nor skips a step in them.

        Raises:
            TypeError, ValueError: if ``state`` is not such a state (a missing or malformed
                field, an ``rdp`` vector that is not the saved history's, an optimizer trace
                that does not cover the history), naming the field; the state is validated
                whole first, so nothing changes then (monitor and accountants).
        """
        restored = restore(state, self.accountant, self._corrected if self._own_corrected else None)
        self.should_stop = restored.should_stop
        self.stop_reason = restored.stop_reason
        self.records_emitted = restored.records_emitted
        self._hooks.restart(restored.physical_steps)
        self.last_record = restored.last_record
        self._sync(restored.rdp)
        self._overhead.restart()
        assert self._evaluator is not None
        if rewind_sinks and self.calls_sinks:
            self._dispatch.call("rewind", self._evaluator.evaluated)

    def __repr__(self) -> str:
        return (
            f"PrivacyMonitor(delta={self.delta:g}, steps={steps_of(self.accountant)}, "
            f"sinks={len(self.sinks)}, budget={self.budget!r}, attached={self.attached})"
        )
