"""A run kept as it grows: the incremental form of the registry of privacy models.

:class:`KeptModel` records steps as training takes them (runs of steps at one (sigma, q),
each with the optimizer settings it used, or with settings unknown) and answers
``epsilon(delta, name)`` and ``delta(epsilon, name)`` for any registry name
(:mod:`.privacy_models`). Which computation answers is decided by
:func:`~.privacy_models.choose`, the one place that decides it for a run from scratch too:

* ``"heuristic"`` on Poisson batches without per-step weights: the kept constant-rate engine
  (:class:`~.last_iterate.incremental.IncrementalHeuristic`: a warm-started root find per
  query, not a computation from scratch);
* ``"heuristic"`` on Poisson batches with weights (a learning rate that changes, momentum or
  weight decay recorded for every step): the kept weighted engine
  (:class:`~.last_iterate.incremental_weighted.IncrementalWeightedHeuristic`), an upper bound
  within :attr:`KeptModel.accuracy` relative;
* everything else (epoch schemes, the robust maximum, the standard bounds, delta of a
  weighted run, a privacy unit of more than one record: :attr:`KeptModel.unit`,
  ``docs/privacy_units.md``): the registry's model of :attr:`KeptModel.run`, built from
  scratch.

**The per-step weights** of the recorded settings come from :data:`OPTIMIZER_WEIGHTS`: the
settings class of an optimizer mapped to the function that turns a run-length list of its
settings into the weights w_t of the steps in the final model. A new optimizer is one entry
there (its settings class, recorded by the accountant's hook, and its weights function); the
kept weighted engine follows SGD only, other optimizers are answered from scratch. The
adaptive optimizers (:class:`~.last_iterate.adaptive_steps.AdaptiveStep`: Adam, AdamW and the
rest, ``docs/adaptive_optimizers.md``) always weigh their steps unequally (bias corrections,
the frozen second moment), so a run recorded with them is always weighted; an Adam or
AdamW run (no L2 weight decay, one beta1) is followed by the kept weighted engine through
its SGD equivalent (:class:`~.last_iterate.adaptive_steps.SGDEquivalent`: the same epsilon),
the other adaptive runs are answered from scratch.

The number is what the model of the registry says it is: the heuristic is exact for linear
losses and not a proven bound for deep networks, and describes the final model only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta, check_epsilon
from opacus_lastiterate.analysis.last_iterate.adaptive_columns import (
    AdaptiveColumns,
    AdaptiveStepTrace,
    adaptive_columns_weights,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    AdaptiveStep,
    SGDEquivalent,
    adaptive_run_weights,
)
from opacus_lastiterate.analysis.last_iterate.incremental import IncrementalHeuristic, SuffixPeak
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings, sgd_weights
from opacus_lastiterate.analysis.last_iterate.settings_columns import (
    HeavyBallTrace,
    SettingsTrace,
    TraceColumns,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import WeightedHeuristicResult
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_models import PRIVACY_MODELS, Choice, ModelName, choose
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import SamplingScheme, check_sampling

__all__ = [
    "KeptModel",
]

SettingsRuns = Sequence[tuple[Any, int]]
"""Run-length encoded optimizer settings: (settings, steps), oldest first."""


def _sgd_run_weights(runs: Any) -> np.ndarray:
    """The SGD weights of run-length settings, (settings, steps) pairs or columns."""
    if not isinstance(runs, TraceColumns):
        runs = _sgd_columns(runs)
    lr, momentum, dampening, nesterov, weight_decay = runs.per_step()
    return sgd_weights(
        lr, momentum=momentum, dampening=dampening, nesterov=bool(nesterov.any()),
        weight_decay=weight_decay,
    )  # fmt: skip


def _sgd_columns(runs: SettingsRuns) -> TraceColumns:
    """Run-length SGD settings as columns."""
    trace = SettingsTrace()
    for settings, steps in runs:
        trace.append(settings.as_tuple(), int(steps))
    return trace.columns()


def _adaptive_run_weights(runs: Any) -> np.ndarray:
    """The adaptive weights of run-length steps, (step, steps) pairs or columns."""
    if isinstance(runs, AdaptiveColumns):
        return adaptive_columns_weights(runs)  # in numpy: no Python object per step
    return adaptive_run_weights(runs)


def _sgd_varies(first: SGDSettings, settings: SGDSettings) -> bool:
    return settings.lr != first.lr or settings.momentum != 0.0 or settings.weight_decay != 0.0


def _adaptive_varies(first: AdaptiveStep, settings: AdaptiveStep) -> bool:
    return True  # the bias corrections and the second moment weigh the steps unequally


OPTIMIZER_WEIGHTS: Mapping[type, tuple[Callable[[Any], np.ndarray],
                                       Callable[[Any, Any], bool]]] = {
    SGDSettings: (_sgd_run_weights, _sgd_varies),
    AdaptiveStep: (_adaptive_run_weights, _adaptive_varies),
}
"""Settings class of an optimizer -> (weights of a run-length list of its settings (also of
their columns, as the kept model holds them: SGD's
:class:`~.last_iterate.settings_columns.TraceColumns`, the adaptive steps'
:class:`~.last_iterate.adaptive_columns.AdaptiveColumns`), whether
settings differ from the first step's in a way that changes the weights: (first, settings)
-> bool). The one place a new optimizer's weights are added (module docstring)."""


class KeptModel:
    """The privacy numbers of a run that grows step by step (module docstring).

    Inputs to :meth:`append` and :meth:`advance` are trusted (validated by the caller, the
    accountant at its boundary); the queries validate their argument.

    Args:
        sampling: the sampling scheme of the batches (:mod:`.sampling`), None for Poisson.
        accuracy: requested relative accuracy of the weighted heuristic, in (0, 1).
        unit: the privacy unit (:class:`~.privacy_unit.PrivacyUnit`), None for one record.
    """

    def __init__(
        self,
        *,
        sampling: SamplingScheme | None = None,
        accuracy: float = 1e-3,
        unit: PrivacyUnit | None = None,
    ) -> None:
        self._sampling = check_sampling(sampling)
        self._unit = _check_unit(unit)
        self.accuracy = float(accuracy)
        """Requested relative accuracy of the weighted heuristic (a change rebuilds it)."""
        self._constant = IncrementalHeuristic()
        # the settings, run-length, as columns: SGD's or an adaptive optimizer's
        self._sgd = SettingsTrace()
        self._adaptive = AdaptiveStepTrace()
        self._known = True  # every step's settings recorded
        self._varies = False
        self._weighted: IncrementalWeightedHeuristic | None = None
        self._saved: Mapping[str, Any] | None = None  # a characteristic to restore
        # an adaptive run as the SGD run the kept engine follows (None: not mapped)
        self._equivalent: SGDEquivalent | None = None
        self._sgd_view: HeavyBallTrace | None = None  # its settings
        self._run: DPSGDRun | None = None

    @classmethod
    def from_run(
        cls,
        run: DPSGDRun,
        settings: SettingsRuns | TraceColumns | AdaptiveColumns | None = None,
        *,
        accuracy: float = 1e-3,
    ) -> KeptModel:
        """The kept model of an existing run: its segments with ``settings`` (run-length
        (settings, steps) covering every step, or as columns: SGD's
        :class:`~.last_iterate.settings_columns.TraceColumns`, an adaptive optimizer's
        :class:`~.last_iterate.adaptive_columns.AdaptiveColumns`, trusted; either way taken
        in at once, with no Python object per step), or settings unknown when None."""
        kept = cls(sampling=run.sampling, accuracy=accuracy, unit=run.unit)
        if settings is not None and not isinstance(settings, (TraceColumns, AdaptiveColumns)):
            settings = list(settings)
            if settings and all(type(s) is SGDSettings for s, _ in settings):
                settings = _sgd_columns(settings)
            elif settings and all(type(s) is AdaptiveStep for s, _ in settings):
                settings = AdaptiveColumns.from_runs(settings)
        if isinstance(settings, TraceColumns):
            return kept._take_columns(run, settings)
        if isinstance(settings, AdaptiveColumns):
            return kept._take_adaptive(run, settings)
        runs = [] if settings is None else [[s, int(n)] for s, n in settings if n > 0]
        if settings is not None and sum(n for _, n in runs) != run.num_steps:
            raise ValueError(
                f"`settings` must cover the run's {run.num_steps} steps, got "
                f"{sum(n for _, n in runs)}."
            )
        i = 0
        for seg in run.segments:
            left = seg.steps
            while left:
                if settings is None:
                    take, st = left, None
                else:
                    take = min(left, runs[i][1])
                    st = runs[i][0]
                    runs[i][1] -= take
                    i += runs[i][1] == 0
                kept.append(seg.noise_multiplier, seg.sample_rate, take, st)
                left -= take
        return kept

    def _take_segments(self, run: DPSGDRun, covered: int) -> None:
        """Check that settings for ``covered`` steps cover ``run``; take in its segments."""
        if covered != run.num_steps:
            raise ValueError(f"`settings` must cover the run's {run.num_steps} steps, got {covered}.")
        for seg in run.segments:
            self._constant.append(seg.noise_multiplier, seg.sample_rate, seg.steps)

    def _take_columns(self, run: DPSGDRun, columns: TraceColumns) -> KeptModel:
        """Take in ``run`` with SGD settings ``columns`` at once (what :meth:`append` of each
        entry would record; the weighted engine is built at its first use)."""
        columns = columns.without_empty()
        self._take_segments(run, int(columns.steps.sum()))
        self._sgd = SettingsTrace(columns)
        self._varies = self._sgd.varies
        self._run = None
        return self

    def _take_adaptive(self, run: DPSGDRun, columns: AdaptiveColumns) -> KeptModel:
        """Take in ``run`` with adaptive steps ``columns`` at once: what :meth:`append` of
        each run would record, its SGD equivalent computed in numpy with the same floats."""
        columns = columns.without_empty()
        covered = int(columns.steps.sum())
        self._take_segments(run, covered)
        self._adaptive = AdaptiveStepTrace(columns)
        self._varies = covered > 0  # the adaptive steps always weigh the steps unequally
        self._run = None
        if not covered:
            return self
        equivalent = SGDEquivalent()
        rates = equivalent.extend(columns)
        if rates is None:
            self._equivalent = self._sgd_view = None
            return self
        self._equivalent = equivalent
        self._sgd_view = HeavyBallTrace(float(equivalent.beta1 or 0.0), rates)
        return self

    # -- the run ------------------------------------------------------------------------------

    @property
    def sampling(self) -> SamplingScheme | None:
        """How the batches are drawn (None: Poisson at the recorded rates)."""
        return self._sampling

    @sampling.setter
    def sampling(self, scheme: SamplingScheme | None) -> None:
        checked = check_sampling(scheme)
        if checked != self._sampling:
            self._sampling, self._run = checked, None

    @property
    def unit(self) -> PrivacyUnit:
        """What one number protects (``docs/privacy_units.md``): one record unless set."""
        return self._unit

    @unit.setter
    def unit(self, unit: PrivacyUnit | None) -> None:
        checked = _check_unit(unit)
        if checked != self._unit:
            self._unit, self._run = checked, None

    @property
    def num_steps(self) -> int:
        return self._constant.num_steps

    @property
    def uses_weights(self) -> bool:
        """Whether the recorded settings cover every step and change the weights of the steps
        in the final model (a learning rate that changes, momentum, weight decay)."""
        return self._known and self._varies

    @property
    def settings(self) -> list[tuple[Any, int]] | None:
        """The recorded settings, run-length encoded; None when some step's are unknown."""
        if not self._known:
            return None
        if len(self._sgd):
            return [(SGDSettings(*e[:5]), e[5]) for e in self._sgd.entries()]
        return self._adaptive.runs()

    @property
    def adaptive_columns(self) -> AdaptiveColumns | None:
        """The recorded adaptive steps as columns (views: read them), without a Python object
        per step; None unless an adaptive optimizer's steps cover every step."""
        if not self._known or not len(self._adaptive):
            return None
        return self._adaptive.columns()

    @property
    def settings_columns(self) -> TraceColumns | AdaptiveColumns | None:
        """:attr:`settings` as columns (views: read them), for :meth:`from_run` of another
        model of the same steps without a Python object per step; None as :attr:`settings`."""
        if not self._known or not (len(self._sgd) or len(self._adaptive)):
            return None
        return self._sgd.columns() if len(self._sgd) else self._adaptive.columns()

    @property
    def run(self) -> DPSGDRun:
        """The recorded run: segments, the per-step weights when :attr:`uses_weights`, and
        the sampling scheme (built on first use after a change)."""
        if self._run is None:
            self._run = DPSGDRun._trusted(
                self._constant.segments, self.weights() if self.uses_weights else None,
                sampling=self._sampling, unit=self._unit,
            )  # fmt: skip
        return self._run

    def weights(self) -> np.ndarray:
        """The per-step weights of the recorded settings (:data:`OPTIMIZER_WEIGHTS`).

        Raises:
            ValueError: no settings for every step, or a weight that is negative or not
                finite (as :class:`~.run.DPSGDRun` refuses): the final model is then not a
                weighting of the noisy gradients that the heuristic describes (for Adam's
                L2 ``weight_decay``, lr * weight_decay above the frozen preconditioner flips
                the parameter's sign at every step).
        """
        if not self._known or not (len(self._adaptive) or len(self._sgd)):
            raise ValueError("no optimizer settings were recorded for every step.")
        if len(self._sgd):
            weights = OPTIMIZER_WEIGHTS[SGDSettings][0](self._sgd.columns())
        else:
            weights = OPTIMIZER_WEIGHTS[AdaptiveStep][0](self._adaptive.columns())
        bad = np.flatnonzero(~(np.isfinite(weights) & (weights >= 0)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"the weights of the recorded optimizer settings must be finite and >= 0, got "
                f"{float(weights[i])!r} at step {i + 1}: the final model is not a weighting of "
                "the noisy gradients that the heuristic describes (with an L2 weight_decay, "
                "lr * weight_decay above the optimizer's preconditioner flips the parameter's "
                "sign at every step)."
            )
        weights.setflags(write=False)
        return weights

    def check_weights(self) -> None:
        """Raise the ValueError of :meth:`weights` for weights the heuristic does not
        describe; computes nothing for an Adam or AdamW run that the kept engine follows
        through its SGD equivalent (module docstring), whose weights are non-negative
        multiples of heavy-ball SGD weights at positive learning rates."""
        if self.uses_weights and not (len(self._adaptive) and self._sgd_view is not None):
            self.run  # its weights, checked (and kept for the query that follows)

    def append(
        self, noise_multiplier: float, sample_rate: float, steps: int = 1, settings: Any = None
    ) -> None:
        """Record ``steps`` steps at (sigma, q) that used the optimizer ``settings`` (an
        instance of a class of :data:`OPTIMIZER_WEIGHTS`), or settings unknown (None: the
        weights are then unknown for good, and the constant-rate formula answers)."""
        if steps <= 0:
            return
        self._constant.append(noise_multiplier, sample_rate, steps)
        keys = self._note(settings, steps)
        engine = self._weighted
        if engine is not None and settings is not None and self._kept_weighted():
            for k in range(steps):  # the kept engine follows the steps, O(1) each
                key = settings.as_tuple() if keys is None else keys[k]
                engine.append(noise_multiplier, sample_rate, *key)
        elif self._kept_weighted():
            # from the first step whose weights matter the engine follows the steps, so that
            # the first query does not take in the whole run (O(T))
            self._weighted_engine()
        else:
            self._weighted = None

    def advance(
        self, noise_multiplier: float | np.ndarray, sample_rate: float, steps: int,
        delta: float, settings: Any = None,
    ) -> np.ndarray:
        """Record ``steps`` steps at (sigma, q) (``noise_multiplier``: one sigma, or one per
        step) with ``settings`` that keep the run on the
        constant-rate formula (not :attr:`uses_weights` after them), and return the
        heuristic epsilon at (validated) ``delta`` after each, solved together
        (:meth:`IncrementalHeuristic.advance`) in batches of at most as many steps as came
        before (at least 16): the batch solve extrapolates from the last solves, which holds
        over a batch as long as the run so far but not over a much longer one."""
        if not self._unit.single_record:
            raise ValueError(
                f"`unit` is {self._unit.describe()}: the batch solve is the record-level "
                "heuristic; record the steps with append and ask epsilon."
            )
        self._note(settings, steps)
        if self.uses_weights:
            raise ValueError("`settings` change the weights: record the steps with append.")
        self._weighted = None
        sigmas = np.broadcast_to(np.asarray(noise_multiplier, dtype=float), (steps,))
        parts, done, before = [], 0, self.num_steps
        while done < steps:
            chunk = min(steps - done, max(16, before + done))
            parts.append(
                self._constant.advance(sigmas[done:done + chunk], sample_rate, chunk, delta)
            )
            done += chunk
        return np.concatenate(parts)

    def _note(self, settings: Any, steps: int) -> list[tuple[Any, ...]] | None:
        """Record the settings of ``steps`` steps; the SGD-equivalent settings of each of
        them for an adaptive run that has one, else None."""
        self._run = None
        if settings is None:
            self._known, self._varies = False, False
            self._sgd, self._adaptive = SettingsTrace(), AdaptiveStepTrace()
            self._equivalent = self._sgd_view = None
            return None
        if not self._known:
            return None
        if type(settings) not in OPTIMIZER_WEIGHTS:
            raise TypeError(
                f"`settings` must be one of {', '.join(c.__name__ for c in OPTIMIZER_WEIGHTS)} "
                f"or None, got {type(settings).__name__}."
            )
        before = SGDSettings if len(self._sgd) else AdaptiveStep if len(self._adaptive) else None
        if before is not None and type(settings) is not before:
            raise TypeError(
                f"`settings` must be of one optimizer, got {type(settings).__name__} after "
                f"{before.__name__}."
            )
        if type(settings) is SGDSettings:  # as columns: no Python object per step
            self._sgd.append(settings.as_tuple(), steps)
            self._varies = self._sgd.varies
            return None
        keys = self._note_equivalent(settings, steps)
        self._adaptive.append(settings, steps)
        self._varies = True  # _adaptive_varies: the steps always weigh unequally
        return keys

    def _note_equivalent(self, settings: AdaptiveStep, steps: int) -> list[tuple[Any, ...]] | None:
        """Follow an adaptive run's SGD equivalent (module docstring): the SGD settings of
        the ``steps`` new steps, or None where the run has none."""
        if not len(self._adaptive):
            self._equivalent = SGDEquivalent()
            self._sgd_view = HeavyBallTrace(settings.settings.beta1)
        equivalent, view = self._equivalent, self._sgd_view
        if equivalent is None or view is None:
            return None
        keys = []
        for _ in range(steps):
            st = equivalent.append(settings)
            if st is None:
                self._equivalent = self._sgd_view = None
                return None
            view.append(st.lr)
            keys.append(view.key(st.lr))
        return keys

    # -- the kept weighted engine ------------------------------------------------------------

    def _weighted_engine(self) -> IncrementalWeightedHeuristic:
        """The kept weighted engine, built from the recorded run when missing or out of step
        (SGD settings only)."""
        engine = self._weighted
        if engine is None or engine.num_steps != self.num_steps or engine.accuracy != self.accuracy:
            engine = IncrementalWeightedHeuristic(self.accuracy)
            sigma, q = self._constant.run.per_step()
            columns = (self._sgd if self._sgd_view is None else self._sgd_view).columns()
            engine.extend(sigma, q, *columns.per_step())
            saved, self._saved = self._saved, None
            if saved is not None:
                engine.restore_characteristic(saved)
            self._weighted = engine
        return engine

    def characteristic_state(self) -> Mapping[str, Any] | None:
        """The kept weighted engine's characteristic function (a cache for a checkpoint), or
        the one restored and not yet taken up; None when there is none."""
        engine = self._weighted
        if engine is not None and engine.num_steps == self.num_steps:
            got = engine.characteristic_state()
            if got is not None:
                return got
        return self._saved

    def restore_characteristic(self, state: Mapping[str, Any] | None) -> None:
        """Take up a :meth:`characteristic_state` saved for this run (ignored if it is not
        for this run): the weighted engine is built now when the weights are in use."""
        self._saved = state
        if state is not None and self._kept_weighted():
            self._weighted = None
            self._weighted_engine()
        self._saved = None

    # -- queries -------------------------------------------------------------------------------

    def choice(self, name: ModelName | str = "heuristic") -> Choice:
        """How ``name`` is computed for the run as it stands (:func:`~.privacy_models.choose`)."""
        return choose(
            name, sampling=self._sampling, weighted=self.uses_weights, unit=self._unit
        )

    def epsilon(self, delta: float, name: ModelName | str = "heuristic", **params: Any) -> float:
        """Epsilon at ``delta`` of the registry model ``name`` for the recorded run."""
        d = check_delta(delta)
        choice = self.choice(name)
        if self.num_steps == 0:
            return 0.0
        if choice.kept == "constant" and not params:
            return float(self._constant.epsilon(d))
        if choice.kept == "weighted" and not params and self._kept_weighted():
            return float(self.weighted_result(d).epsilon)
        return float(self._build(choice, params).epsilon(d))

    def delta(self, epsilon: float, name: ModelName | str = "heuristic", **params: Any) -> float:
        """delta(``epsilon``) of the registry model ``name`` for the recorded run (the kept
        weighted engine answers epsilon only: delta of a weighted run is from scratch)."""
        e = check_epsilon(epsilon)
        choice = self.choice(name)
        if self.num_steps == 0:
            return 0.0
        if choice.kept == "constant" and not params:
            return float(self._constant.delta(e))
        return float(self._build(choice, params).delta(e))

    def weighted_result(self, delta: float) -> WeightedHeuristicResult:
        """The weighted heuristic at ``delta`` with its achieved accuracy, by the kept engine
        (cached per step). Requires :attr:`uses_weights` with SGD settings, or an Adam/AdamW
        run that maps onto SGD (module docstring), and one record as the unit (for another
        unit the number is :meth:`epsilon`'s, from scratch)."""
        d = check_delta(delta)
        if not self._unit.single_record:
            raise ValueError(
                f"`unit` is {self._unit.describe()}: the kept weighted engine is the "
                "record-level one; epsilon(delta) gives the number of this unit."
            )
        if not self._kept_weighted():
            raise ValueError(
                "the kept weighted engine needs SGD settings that change the weights (or an "
                "Adam/AdamW run without L2 weight decay), recorded for every step."
            )
        return self._weighted_engine().epsilon(d)

    def suffix_peak(self, delta: float) -> SuffixPeak | None:
        """The largest eps_t of the constant-rate formula seen for t steps of the current
        (single) segment (:meth:`IncrementalHeuristic.suffix_peak`)."""
        return self._constant.suffix_peak(delta)

    def _kept_weighted(self) -> bool:
        return self.uses_weights and (
            len(self._sgd) > 0 or self._sgd_view is not None
        )

    def _build(self, choice: Choice, params: Mapping[str, Any]) -> PrivacyModel:
        """The from-scratch model of ``choice`` for the recorded run (without its weights
        where the model does not read them: they are then not computed), at
        :attr:`accuracy` where it takes one."""
        if choice.weights or not self.uses_weights:
            run = self.run
        else:
            run = DPSGDRun._trusted(
                self._constant.segments, sampling=self._sampling, unit=self._unit
            )
        if "accuracy" in PRIVACY_MODELS[choice.name].defaults and "accuracy" not in params:
            params = {**params, "accuracy": self.accuracy}
        return choice.build(run, **params)

    def __repr__(self) -> str:
        return (
            f"KeptModel(steps={self.num_steps}, weights={self.uses_weights}, "
            f"sampling={self._sampling!r}, unit={self._unit.code()!r})"
        )


_RECORD = PrivacyUnit.record()


def _check_unit(unit: object) -> PrivacyUnit:
    """``unit`` as a :class:`~.privacy_unit.PrivacyUnit` (None: one record)."""
    if unit is None:
        return _RECORD
    if not isinstance(unit, PrivacyUnit):
        raise TypeError(f"`unit` must be a PrivacyUnit or None, got {unit!r}.")
    return unit
