"""Turning recorded steps into :class:`~opacus_lastiterate.callbacks.records.EpsilonRecord`
objects: the monitor's evaluator.

On the training hot path the monitor only queues each step as a :data:`QueuedStep`. An
evaluator turns queued steps into records, in step order, as an accountant asked after every
step would answer: it replays them into its own
:class:`~opacus_lastiterate.accountants.LastIterateAccountant` (the *replica*, fed through
the accountant's public incremental API), composes their RDP vectors
(:class:`~opacus_lastiterate.accountants.IncrementalRDP`: Opacus's own RDP number, at its
orders) and computes the robust, PLD and corrected values on their cadences. The standard
values are the registry's, chosen for the run (``replica.kept_model.epsilon(delta,
"standard")``; the registry on the evaluated steps without a replica): for a run whose
batches are not Poisson (the accountant's ``sampling``, ``docs/samplers.md``) the bound of
that scheme, and ``poisson_assumed_epsilon`` carries the Poisson value, labelled as an
assumption; every record names its scheme. The replica has the accountant's privacy unit
(``docs/privacy_units.md``): for a unit of more than one record the heuristic and standard
values are that unit's, computed from scratch at every step they are due (no
batch solve, no kept weighted engine: those are one record's), the robust value is not
computed (no model), and Opacus's RDP value, the Poisson-assumed one (Opacus's number) and the
corrected one stay one record's
(:func:`~opacus_lastiterate.callbacks.records.labels_for` says so).

Queued steps are solved together where they can be: runs of one constant-rate setting
(:meth:`LastIterateAccountant.replay_steps
<opacus_lastiterate.accountants.LastIterateAccountant.replay_steps>`), and the weighted
heuristic (a learning-rate schedule, momentum) of Poisson runs: the evaluator keeps an
:class:`~opacus_lastiterate.analysis.last_iterate.incremental_weighted.IncrementalWeightedHeuristic`
of the evaluated steps (built from the replica's history and optimizer trace when first
needed), which answers every step of a batch with one characteristic-function update and
one vectorised root refinement per block of steps
(:meth:`~opacus_lastiterate.analysis.last_iterate.incremental_weighted.IncrementalWeightedHeuristic.epsilons`):
the values the replica's ``get_epsilon`` gives step by step, to the root finder's tolerance
(both upper bounds within ``weight_accuracy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from opacus_lastiterate.accountants import (
    ASGMAccountant,
    FEASGMAccountant,
    LastIterateAccountant,
    RunAccountant,
)
from opacus_lastiterate.accountants.any_accountant import steps_of
from opacus_lastiterate.accountants.base import trim_history
from opacus_lastiterate.accountants.incremental_rdp import IncrementalRDP
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment, append_steps, as_segments
from opacus_lastiterate.analysis.sampling import PoissonSampling, effective_sampling
from opacus_lastiterate.callbacks.cadence import Cadences, OverheadBudget, due
from opacus_lastiterate.callbacks.records import EpsilonRecord, sampling_field

__all__ = []

QueuedStep = tuple[int, float, float, float | None, SGDSettings | None]
"""A recorded step waiting for its record: (step, sigma, q, lr, SGD settings)."""

MIN_RUN = 4
"""Queued steps of one constant-rate setting replayed together (fewer: one by one)."""


def evaluated_state(
    history: Sequence[Sequence[Any]], rdp: Sequence[float] | np.ndarray | None
) -> tuple[list[TrainingSegment], int, IncrementalRDP]:
    """An evaluator's start: the run-length history of the evaluated steps (a list, extended
    in place by :func:`~opacus_lastiterate.analysis.run.append_steps`), their number, and
    their RDP vector (``rdp`` if given, a checkpoint's; else composed from the history)."""
    steps = list(as_segments(history))
    bound = IncrementalRDP()
    if rdp is not None and len(rdp) == bound.orders.size:
        bound.rdp = np.asarray(rdp, dtype=float)
    else:
        bound.reset((s.noise_multiplier, s.sample_rate, s.steps) for s in steps)
    return steps, sum(s.steps for s in steps), bound


_RECORD = PrivacyUnit.record()

NORMALISATION_ACCOUNTANTS = (ASGMAccountant, FEASGMAccountant)
"""The accountants whose epsilon is the corrected value."""


def corrected_accountant_of(accountant: Any, corrected: Any) -> Any:
    """The accountant whose epsilon is the corrected value: ``corrected`` if given, else the
    monitored ``accountant`` when it is a normalisation accountant, else None."""
    if corrected is None and isinstance(accountant, NORMALISATION_ACCOUNTANTS):
        return accountant
    return corrected


class InlineEvaluator:
    """Evaluates on the calling thread (module docs).

    Args:
        accountant: the monitored Opacus accountant, at the state to start from (its last
            ``dropped`` steps excluded); a ``LastIterateAccountant`` gives heuristic and
            robust values, any other accountant only the standard ones.
        delta: target delta (validated by the monitor).
        cadences: when each value is computed.
        corrected: an ``ASGMAccountant``/``FEASGMAccountant`` whose epsilon is the
            corrected value (it may have recorded more steps than are evaluated: it is then
            asked at the evaluated history, :meth:`RunAccountant.with_history`).
        overhead: the budget of the ``"auto"`` cadences (None: ``"auto"`` means doubling).
        dropped: the accountant's last steps that are not evaluated (queued elsewhere).
        rdp: the RDP vector of the evaluated steps, if known (a checkpoint's).
        last_lr: the learning rate of the last evaluated step.
    """

    def __init__(
        self,
        accountant: Any,
        *,
        delta: float,
        cadences: Cadences,
        corrected: RunAccountant | None = None,
        overhead: OverheadBudget | None = None,
        dropped: int = 0,
        rdp: Sequence[float] | np.ndarray | None = None,
        last_lr: float | None = None,
    ) -> None:
        self.delta = delta
        self.cadences = cadences
        self.corrected = corrected
        self.overhead = overhead
        self.replica: LastIterateAccountant | None = None
        if isinstance(accountant, LastIterateAccountant):
            replica = LastIterateAccountant(
                weight_accuracy=accountant.weight_accuracy, unit=accountant.unit
            )
            replica.load_state_dict(accountant.state_dict())
            replica.take_back(dropped)
            self.replica = replica
            self._monitored = accountant  # its unit is followed (_follow_unit)
            history = replica.history
        else:
            history = trim_history(accountant.history, dropped)
        self.history, self.evaluated, self.rdp = evaluated_state(history, rdp)
        self.last_lr = last_lr
        self._sampling = getattr(accountant, "sampling", None)
        self._weighted: IncrementalWeightedHeuristic | None = None  # built when first needed

    @property
    def rdp_vector(self) -> np.ndarray:
        """The RDP vector of the evaluated steps (checkpoints save it)."""
        return self.rdp.rdp

    def evaluate(
        self,
        queue: list[QueuedStep],
        out: list[EpsilonRecord] | None = None,
        *,
        need: str | None = None,
    ) -> list[EpsilonRecord]:
        """The records of ``queue``, in order, appended to ``out`` as each is made (so an
        interruption loses none that were made) and returned (``need``: a field that the
        last one must have, for the budget guard). Runs of steps with the same settings
        under the constant-rate formula are replayed together."""
        out = [] if out is None else out
        if not queue:
            return out
        self._follow_unit()
        rdp = self.rdp.advance([(sigma, q) for _, sigma, q, _, _ in queue], self.delta)
        last = len(queue) - 1
        i = 0
        while i < len(queue):
            j = self._constant_run(queue, i, need)
            heuristics = None
            if j - i >= MIN_RUN:
                _, _, q, _, settings = queue[i]
                assert self.replica is not None
                heuristics = self.replica.replay_steps(
                    [entry[1] for entry in queue[i:j]], q, settings, j - i, delta=self.delta
                )
            if heuristics is None:
                j = self._weighted_run(queue, i, need)
                if j > i:
                    self._evaluate_weighted(queue[i:j], rdp[i:j], need if j > last else None, out)
                    i = j
                    continue
                out.append(self._evaluate_step(queue[i], float(rdp[i]), need if i == last else None))
                i += 1
                continue
            for k in range(i, j):
                _, sigma, q, _, _ = queue[k]
                self._extend(sigma, q)
                out.append(
                    self._record(
                        queue[k], float(rdp[k]), float(heuristics[k - i]),
                        need if k == last else None,
                    )
                )  # fmt: skip
            i = j
        return out

    def final_record(self) -> EpsilonRecord:
        """The final record: every epsilon of the evaluated steps (some must exist)."""
        sigma, q, _ = self.history[-1]
        d = self.delta
        self._follow_unit()
        heuristic = robust = None
        if self.replica is not None:
            heuristic = self._heuristic()
            if self.unit.single_record:  # no robust model for another unit
                robust = float(self.replica.get_epsilon(d, robust=True))
        pld, corrected, assumed = self._standard()
        return EpsilonRecord(
            step=self.evaluated,
            delta=d,
            heuristic_epsilon=heuristic,
            robust_heuristic_epsilon=robust,
            opacus_rdp_epsilon=self._opacus_rdp(self.rdp.epsilon(d)),
            standard_epsilon=pld,
            corrected_epsilon=corrected,
            lr=self.last_lr,
            noise_multiplier=float(sigma),
            sample_rate=float(q),
            final=True,
            sampling=sampling_field(self.sampling),
            poisson_assumed_epsilon=assumed,
            optimizer=self.adaptive_optimizer,
            privacy_unit=self.unit.code(),
        )

    # -- for the budget guard ---------------------------------------------------------------

    def stays_constant_rate(self, settings: SGDSettings | None) -> bool:
        """Whether more steps with ``settings`` keep the constant-rate heuristic."""
        return self.replica is not None and self.replica.stays_constant_rate(settings)

    @property
    def weight_accuracy(self) -> float:
        """The weighted heuristic's accuracy (0 without a heuristic)."""
        return 0.0 if self.replica is None else self.replica.weight_accuracy

    def take_back_last(self) -> None:
        """Undo the last evaluated step (replica, RDP vector, history)."""
        self._weighted = None  # rebuilt from the replica when next needed
        if self.replica is not None:
            self.replica.take_back(1)
        self.rdp.rdp = self.rdp.previous
        last = self.history.pop()
        if last.steps > 1:
            append_steps(self.history, last.noise_multiplier, last.sample_rate, last.steps - 1)
        self.evaluated -= 1

    # -- one step ---------------------------------------------------------------------------

    def _extend(self, sigma: float, q: float) -> None:
        """One more evaluated step."""
        append_steps(self.history, sigma, q)
        self.evaluated += 1

    def _constant_run(self, queue: list[QueuedStep], i: int, need: str | None) -> int:
        """The end j of the run queue[i:j] that can be replayed together: the same q and
        settings (sigma may change: a noise schedule), the heuristic due at every step, and
        nothing else due (nor ``need``) before its last step."""
        replica = self.replica
        c = self.cadences
        if (
            replica is None or c.heuristic_every != 1 or replica.uses_weights
            or not replica.unit.single_record
        ):
            return i
        _, _, q, _, settings = queue[i]
        j = i
        while j < len(queue):
            step, _, q_j, _, settings_j = queue[j]
            if (q_j, settings_j) != (q, settings):
                break
            j += 1
            if (
                (need is not None and j == len(queue))
                or due(step, c.robust_every)
                or due(step, c.standard_every)
            ):
                break
        return j

    def _evaluate_step(self, entry: QueuedStep, rdp: float, need: str | None) -> EpsilonRecord:
        step, sigma, q, _, settings = entry
        self._extend(sigma, q)
        heuristic = None
        replica = self.replica
        if replica is not None:
            replica.replay_step(sigma, q, settings)
            if self._weighted is not None:  # it follows every evaluated step
                if settings is None:
                    self._weighted = None
                else:
                    self._weighted.append(sigma, q, *settings.as_tuple())
            c = self.cadences
            if replica.uses_weights:  # "auto": every step that fits in the overhead budget
                every = c.weighted_every
                if need == "heuristic_epsilon" or self._is_due(step, "weighted_step", every):
                    heuristic = self._timed("weighted_step", every, self._heuristic)
            elif need == "heuristic_epsilon" or due(step, c.heuristic_every):
                heuristic = float(replica.get_epsilon(self.delta))
        return self._record(entry, rdp, heuristic, need)

    # -- the weighted heuristic of a batch --------------------------------------------------

    def _weighted_engine(self) -> IncrementalWeightedHeuristic | None:
        """The kept weighted heuristic of the evaluated steps, for a Poisson run whose
        replica uses weights (else None); built from the replica's history and trace."""
        replica = self.replica
        if (
            replica is None or not replica.uses_weights or replica.uses_epoch_sampling
            or not replica.unit.single_record  # the kept engine is one record's
        ):
            return None
        if not isinstance(replica.last_settings, SGDSettings):  # adaptive: the replica answers
            return None
        if self._weighted is None:
            engine = IncrementalWeightedHeuristic(replica.weight_accuracy)
            steps = [h[2] for h in replica.history]
            sigma = np.repeat([float(h[0]) for h in replica.history], steps)
            q = np.repeat([float(h[1]) for h in replica.history], steps)
            trace = replica.optimizer_trace
            counts = [e[5] for e in trace]
            columns = [np.repeat([e[f] for e in trace], counts) for f in range(5)]
            engine.extend(sigma, q, *columns)
            self._weighted = engine
        return self._weighted if self._weighted.supported else None

    def _heuristic(self) -> float:
        """The heuristic epsilon of the evaluated steps (the kept weighted engine's where
        it applies: the replica's value, without building the replica's own)."""
        assert self.replica is not None
        engine = self._weighted_engine()
        if engine is not None:
            return float(engine.epsilon(self.delta).epsilon)
        return float(self.replica.get_epsilon(self.delta))

    def _weighted_run(self, queue: list[QueuedStep], i: int, need: str | None) -> int:
        """The end j of the steps queue[i:j] whose weighted heuristic is solved together:
        weights in use on a Poisson run, settings known, and nothing but the heuristic due
        before the last (a robust or PLD value, a doubling step of ``"auto"``, a step of
        ``weighted_every`` k > 1, ``need``)."""
        if self._weighted_engine() is None:
            return i
        c = self.cadences
        every = c.weighted_every
        j = i
        while j < len(queue):
            step, _, _, _, settings = queue[j]
            if settings is None:
                break
            j += 1
            if (
                (need is not None and j == len(queue))
                or (every == "auto" and due(step, "doubling"))
                or (every not in (1, "auto") and due(step, every))
                or due(step, c.robust_every)
                or due(step, c.standard_every)
            ):
                break
        return j

    def _evaluate_weighted(
        self, batch: list[QueuedStep], rdp: np.ndarray, need: str | None,
        out: list[EpsilonRecord],
    ) -> None:
        """Replay ``batch`` and append its records to ``out``: the weighted heuristic at
        every step solved together (``weighted_every`` 1, or ``"auto"`` when the batch fits
        in the overhead budget), else at its last step when due (or when it fits)."""
        assert self.replica is not None
        engine = self._weighted
        assert engine is not None
        for _, sigma, q, _, settings in batch:
            assert settings is not None
            self.replica.replay_step(sigma, q, settings)
            engine.append(sigma, q, *settings.as_tuple())
        count, every, last = len(batch), self.cadences.weighted_every, batch[-1][0]
        values: list[float | None] = [None] * count
        overhead = self.overhead if every == "auto" else None
        if every == 1 or (overhead is not None and overhead.fits("weighted", count)):
            def solve() -> list[Any]:
                return engine.epsilons(self.delta, count)

            got = solve() if overhead is None else overhead.timed_batch("weighted", count, solve)
            values = [None if r is None else float(r.epsilon) for r in got]
        if values[-1] is None and (
            need == "heuristic_epsilon"
            or (every is not None and due(last, "doubling" if every == "auto" else every))
            or (overhead is not None and overhead.fits("weighted_step", 1))
        ):
            values[-1] = self._timed("weighted_step", every, self._heuristic)
        for k, entry in enumerate(batch):
            self._extend(entry[1], entry[2])
            out.append(self._record(entry, float(rdp[k]), values[k], need if k == count - 1 else None))

    def _is_due(self, step: int, kind: str, every: Any) -> bool:
        if self.overhead is None:
            return due(step, every)
        return self.overhead.is_due(step, kind, every)

    def _timed(self, kind: str, every: Any, compute: Any) -> Any:
        if self.overhead is None:
            return compute()
        return self.overhead.timed(kind, every, compute)

    def _record(
        self, entry: QueuedStep, rdp: float, heuristic: float | None, need: str | None
    ) -> EpsilonRecord:
        """The record of the step just replayed: the robust and standard epsilons when due
        (or needed) at this step."""
        step, sigma, q, lr, _ = entry
        d = self.delta
        c = self.cadences
        robust = None
        replica = self.replica
        if replica is not None and replica.unit.single_record and (
            need == "robust_heuristic_epsilon" or self._is_due(step, "robust", c.robust_every)
        ):
            robust = float(
                self._timed("robust", c.robust_every, lambda: replica.get_epsilon(d, robust=True))
            )
        pld = corrected = assumed = None
        if self._is_due(step, "standard", c.standard_every):
            # the Poisson-assumed value (a comparison, not a guarantee) at steps 1, 2, 4, 8, ...
            with_assumed = step & (step - 1) == 0
            pld, corrected, assumed = self._timed(
                "standard", c.standard_every, lambda: self._standard(with_assumed)
            )
        self.last_lr = lr
        return EpsilonRecord(
            step=step,
            delta=d,
            heuristic_epsilon=heuristic,
            robust_heuristic_epsilon=robust,
            opacus_rdp_epsilon=self._opacus_rdp(rdp),
            standard_epsilon=pld,
            corrected_epsilon=corrected,
            lr=lr,
            noise_multiplier=float(sigma),
            sample_rate=float(q),
            final=False,
            sampling=sampling_field(self.sampling),
            poisson_assumed_epsilon=assumed,
            optimizer=self.adaptive_optimizer,
            privacy_unit=self.unit.code(),
        )

    @property
    def adaptive_optimizer(self) -> str | None:
        """The adaptive optimizer whose weights the replica's heuristic uses (the records'
        ``optimizer``, which labels the heuristic), None without one."""
        return None if self.replica is None else self.replica.adaptive_optimizer

    @property
    def sampling(self) -> Any:
        """The run's sampling scheme as evaluated now: the replica's (which drops a scheme
        that a recorded step does not fit, as the accountant does), else the accountant's
        at the start, dropped on the first step that does not fit it."""
        return self.replica.sampling if self.replica is not None else self._sampling

    def _follow_unit(self) -> None:
        """Give the replica the monitored accountant's unit (the user may set it any time)."""
        if self.replica is not None:
            self.replica.unit = self._monitored.unit

    @property
    def unit(self) -> PrivacyUnit:
        """What the numbers protect: the replica's unit (the accountant's), else one record."""
        return self.replica.unit if self.replica is not None else _RECORD

    @property
    def epoch_sampling(self) -> bool:
        """Whether the run's batches come in epochs (the standard fields are then that
        scheme's bound, and no Poisson bound certifies a budget)."""
        scheme = effective_sampling(self.sampling)
        return scheme is not None and not isinstance(scheme, PoissonSampling)

    def _scheme_run(self) -> DPSGDRun:
        try:
            return DPSGDRun.from_history(self.history, sampling=self.sampling)
        except ValueError:  # a step that does not fit the scheme: Poisson from now on
            self._sampling = None
            return DPSGDRun.from_history(self.history)

    def _registry(self, name: str, *, record: bool = False) -> float:
        """The registry's ``name`` for the evaluated steps, chosen for the run's scheme and
        weights: the replica's kept model (of its unit), else (or for one ``record``) the
        registry on the evaluated history."""
        if self.replica is not None and not (record and not self.unit.single_record):
            return self.replica.kept_model.epsilon(self.delta, name)
        return float(privacy_model(name, self._scheme_run()).epsilon(self.delta))

    def _opacus_rdp(self, poisson_rdp: float) -> float:
        """The record's ``opacus_rdp_epsilon``: Opacus's Poisson RDP bound (its orders, not
        the registry's ``"standard_rdp"`` at dp_accounting's), or for batches in epochs the
        scheme's bound (the registry's ``"standard_rdp"``: closed form, every step)."""
        if not self.epoch_sampling:
            return poisson_rdp
        return self._registry("standard_rdp", record=True)  # one record's, as Opacus's

    def _standard(self, with_assumed: bool = True) -> tuple[float, float | None, float | None]:
        """The standard epsilon of the evaluated steps for the run's scheme, the corrected
        epsilon, and (batches in epochs only, when ``with_assumed``) the Poisson-assumed PLD
        value: a per-step record carries it at steps 1, 2, 4, 8, ... (a composition of every
        step so far, about 0.1 s a step at a few hundred steps, for a number that is not a
        guarantee for the run), the final record always."""
        pld = self._registry("standard")  # the registry loads dp_accounting on first use
        assumed = None
        if self.epoch_sampling and with_assumed:  # Opacus's number: the same steps as if Poisson
            poisson = DPSGDRun.from_history(self.history)  # one record's, as Opacus's
            assumed = float(privacy_model("standard", poisson).epsilon(self.delta))
        corrected = None
        acc = self.corrected
        if acc is not None:
            if steps_of(acc) != self.evaluated:  # it is ahead: a copy at this step
                acc = acc.with_history(tuple(self.history))  # type: ignore[arg-type]
            corrected = float(acc.get_epsilon(self.delta))
        return pld, corrected, assumed
