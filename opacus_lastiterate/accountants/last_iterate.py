"""An Opacus accountant that reports the last-iterate heuristic epsilon of the final model.

The number is the heuristic of Steinke et al., "The Last Iterate Advantage" (ICLR 2025,
arXiv 2410.06186; ``docs/last_iterate.md``):
for a history of segments (sigma_i, q_i, T_i) at a constant learning rate,

    P = sum_i Binomial(T_i, q_i) + N(0, sum_i T_i sigma_i^2),   Q = N(0, sum_i T_i sigma_i^2),
    eps(delta) = min{eps >= 0 : max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) <= delta}.

It is exact for linear losses and a *heuristic* otherwise: it is not a proven
differential-privacy bound for deep networks, and it describes the release of the final
model only (intermediate checkpoints are covered only by a standard composition bound).
The mathematics lives in :mod:`opacus_lastiterate.analysis`; which computation answers is
decided there, by :func:`~opacus_lastiterate.analysis.privacy_models.choose` through the
accountant's :class:`~opacus_lastiterate.analysis.kept_model.KeptModel`. This module only keeps
Opacus's bookkeeping (the history, the optimizer trace, the warnings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants.adaptive_plan import planned_adaptive, warn_adaptive_caveats
from opacus_lastiterate.accountants.adaptive_trace import (
    AdaptiveTrace,
    decode_adaptive_trace,
    decode_traces,
    encode_adaptive_trace,
)
from opacus_lastiterate.accountants.base import RunAccountant, synchronized
from opacus_lastiterate.accountants.monotonicity import MonotonicityWatch
from opacus_lastiterate.accountants.optimizer_trace import decode_trace, encode_trace, trim_trace
from opacus_lastiterate.accountants.summary import CAVEAT, summary
from opacus_lastiterate.accountants.unit_setting import (
    UnitOwner,
    check_unit,
    state_unit,
    unit_state,
)
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
    check_int,
    check_sample_rate,
    check_step_noise,
    check_step_noises,
)
from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.adaptive_columns import AdaptiveColumns
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.analysis.last_iterate.settings_columns import (
    SettingsTrace,
    TraceColumns,
    TraceEntry,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import WeightedHeuristicResult
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import runs_of
from opacus_lastiterate.analysis.sampling import PoissonSampling, effective_sampling
from opacus_lastiterate.exceptions import (
    HeuristicCalibrationWarning,
    OptimizerTraceWarning,
)

__all__ = [
    "LastIterateAccountant",
]

MECHANISM = "last_iterate"


StepSettings = SGDSettings | AdaptiveStep
"""The optimizer settings of one step: SGD's, or an adaptive optimizer's with its noise."""

HEURISTIC_LABEL = "heuristic"
"""The label of the heuristic of an SGD run (:attr:`LastIterateAccountant.heuristic_label`)."""


class LastIterateAccountant(UnitOwner, RunAccountant):
    """Opacus accountant for the last-iterate heuristic epsilon of the final model.

    Use it by name once :mod:`opacus_lastiterate` is imported
    (``PrivacyEngine(accountant="last_iterate")``), or assign an instance to
    ``engine.accountant`` before ``make_private``.

    Per-step accounting is incremental: asking for epsilon after every step costs a
    warm-started root find, not a computation from scratch. The privacy unit (:attr:`unit`,
    ``docs/privacy_units.md``): ``unit=`` here, or ``accountant.unit = PrivacyUnit.user(16)``
    on the engine's accountant.

    Attributes:
        history: ``(noise_multiplier, sample_rate, num_steps)`` segments, oldest first,
            run-length merged like Opacus's ``RDPAccountant`` (a copy; assign to replace).

    Note:
        ``len(accountant)`` is the number of history *segments*, as in every Opacus
        accountant; :attr:`num_steps` is the number of steps.
    """

    _MECHANISM = MECHANISM

    def __init__(
        self, *, weight_accuracy: float = 1e-3, unit: PrivacyUnit | None = None
    ) -> None:
        """Create an accountant with an empty history (Opacus's registry calls ``cls()``).

        Args:
            weight_accuracy: requested relative accuracy of the schedule/momentum-weighted
                epsilon, in (0, 1) (:attr:`weight_accuracy`).
            unit: what the numbers protect (:attr:`unit`); None: the unit of an enclosing
                :func:`~.unit_setting.unit_of_new_accountants`, else one record.
        """
        accuracy = check_in_interval("weight_accuracy", weight_accuracy, 0.0, 1.0)
        self._unit = check_unit(unit, new=True)
        self._kept = KeptModel(accuracy=accuracy, unit=self._unit)
        self._calibration_warned = False
        self._trace = SettingsTrace()
        self._trace_disabled = False
        self._monotonicity = MonotonicityWatch()
        self.weight_accuracy = accuracy
        """Requested relative accuracy of the schedule/momentum-weighted epsilon."""
        self._last_settings: SGDSettings | None = None  # last_settings, built when asked
        self._adaptive = AdaptiveTrace()  # the steps of an adaptive optimizer
        self._caveats_warned = False
        self._plan = planned_adaptive()  # make_private_with_epsilon's (adaptive_plan)
        super().__init__()

    # -- bookkeeping hooks (see RunAccountant) ----------------------------------------------

    def _after_step(self, noise_multiplier: float, sample_rate: float) -> None:
        self._kept.append(noise_multiplier, sample_rate, 1, self._step_settings())

    def _step_settings(self) -> StepSettings | None:
        """The settings of the step just recorded: None unless the trace covers every step."""
        if self._trace_disabled:
            return None
        if len(self._adaptive):
            return self._adaptive.last if self._adaptive.covered == self._steps() else None
        if not self._trace or self._trace.covered != self._steps():
            return None
        return self.last_settings

    def _after_reset(self) -> None:
        # a history written from outside has no optimizer settings, but a calibration's plan
        planned = None if self._plan is None else self._plan.runs(self._segments)
        self._kept = KeptModel.from_run(self.run, planned, accuracy=self.weight_accuracy)
        self._trace = SettingsTrace()
        self._adaptive = AdaptiveTrace(planned)
        self._caveats_warned = False
        self._last_settings = None
        self._monotonicity = MonotonicityWatch()

    def _steps(self) -> int:
        return self._num_steps

    # -- optimizer settings (learning-rate schedules, momentum) -----------------------------

    def _observe(self, optim: Any) -> None:
        """Read the SGD settings of this step (Opacus calls the hook in ``pre_step``, before
        the update, so the learning rate read is the one this step uses)."""
        self._record_optimizer(optim)

    def _record_optimizer(self, optim: Any) -> None:
        from opacus_lastiterate.schedules import (  # torch side
            adaptive_step,
            is_adaptive,
            refuse_maximize,
            sgd_settings,
        )

        adaptive = is_adaptive(optim)
        if adaptive:
            refuse_maximize(optim)  # a ValueError: nothing recorded
        if self._trace_disabled:
            return
        try:
            if adaptive:
                step = adaptive_step(optim)
                if len(self._trace):
                    raise ValueError("The optimizer changed from SGD to an adaptive one.")
            else:
                st = sgd_settings(optim)
                if len(self._adaptive):
                    raise ValueError("The optimizer changed from an adaptive one to SGD.")
        except ValueError as err:  # UnsupportedOptimizerError, differing parameter groups
            self._disable_trace()
            warn(
                f"{err} The last-iterate accountant falls back to the constant-rate formula, "
                "which does not describe this optimizer.",
                OptimizerTraceWarning,
            )
            return
        if adaptive:
            self._adaptive.append(step)
        else:
            self._append_settings(
                (st.lr, st.momentum, st.dampening, st.nesterov, st.weight_decay)
            )  # fmt: skip

    def _disable_trace(self) -> None:
        self._trace_disabled, self._trace = True, SettingsTrace()
        self._adaptive, self._last_settings = AdaptiveTrace(), None

    def _append_settings(self, key: tuple[float, float, float, bool, float], steps: int = 1) -> None:
        """Add ``steps`` steps with SGD settings ``key`` to the run-length encoded trace."""
        if self._trace.append(key, steps):
            self._last_settings = None

    @property
    def adaptive_trace(self) -> list[tuple[AdaptiveStep, int]]:
        """Recorded steps of an adaptive optimizer (Adam, AdamW, ...: settings and noise
        std), run-length encoded as (step, number of steps). Empty unless the accountant's
        hook saw one."""
        return self._adaptive.runs()

    @property
    def heuristic_label(self) -> str:
        """What :meth:`get_epsilon` is now: ``"heuristic"``, or for an adaptive optimizer's
        run :data:`~opacus_lastiterate.analysis.last_iterate.adaptive_weights.
        ADAPTIVE_HEURISTIC_LABEL` ("heuristic; adaptive second moment treated as fixed")."""
        return HEURISTIC_LABEL if self.adaptive_optimizer is None else ADAPTIVE_HEURISTIC_LABEL

    @property
    def adaptive_optimizer(self) -> str | None:
        """The adaptive optimizer whose weights :meth:`get_epsilon` uses now (torch's
        lower-case class name, ``"adamw"``; the records' ``optimizer``), else None."""
        last = self._adaptive.last
        return last.settings.optimizer if last is not None and self._adaptive_in_use() else None

    def _adaptive_in_use(self) -> bool:
        return bool(len(self._adaptive)) and self._weights_in_use()

    @property
    def settings_unusable(self) -> bool:
        """Whether the optimizer's settings were seen and cannot be used (the constant-rate
        formula answers from then on)."""
        return self._trace_disabled

    @property
    def optimizer_trace(self) -> list[TraceEntry]:
        """Recorded SGD settings, run-length encoded: (lr, momentum, dampening, nesterov,
        weight_decay, steps). Empty unless the accountant's hook saw the optimizer."""
        return self._trace.entries()

    def _weights_in_use(self) -> bool:
        """True if the recorded settings change the weights of the steps in the final model
        (varying learning rate, momentum or weight decay) and cover every recorded step."""
        return self._kept_model().uses_weights

    def _kept_model(self) -> KeptModel:
        """The kept model of the recorded run, with the current sampling scheme and
        weighted accuracy."""
        kept = self._kept
        kept.sampling = self.sampling
        kept.accuracy = self.weight_accuracy
        kept.unit = self._unit
        if len(self._adaptive) and kept.uses_weights:
            try:
                kept.check_weights()  # nothing to compute for an Adam/AdamW run
            except ValueError as err:  # weights the heuristic does not describe
                self._disable_trace()
                self._kept = KeptModel.from_run(self.run, None, accuracy=self.weight_accuracy)
                warn(f"{err} The last-iterate accountant falls back to the constant-rate formula, "
                     "which does not describe this optimizer.", OptimizerTraceWarning)  # fmt: skip
                return self._kept_model()
        return kept

    @property
    @synchronized
    def kept_model(self) -> KeptModel:
        """The recorded run as the analysis keeps it (:class:`~opacus_lastiterate.analysis.
        kept_model.KeptModel`, with the current sampling scheme and weighted accuracy): ask it
        for any registry number of the run, ``kept_model.epsilon(delta, "standard")``, chosen
        for the run's scheme and weights as :meth:`get_epsilon` is. Read it; the accountant
        appends the steps."""
        return self._kept_model()

    # -- the incremental API: what a replica of the accountant is fed ----------------------

    @property
    def last_settings(self) -> StepSettings | None:
        """The settings the hook read at the last recorded step (SGD's, or an
        :class:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.AdaptiveStep`); None
        when the settings of the steps are not recorded (no optimizer seen, or one whose
        settings the heuristic cannot use). The same object while the settings stay the
        same."""
        if not self._trace_disabled and len(self._adaptive):
            return self._adaptive.last
        last = self._trace.last
        if self._trace_disabled or last is None:
            return None
        if self._last_settings is None:
            self._last_settings = SGDSettings(*last)
        return self._last_settings

    @property
    def uses_weights(self) -> bool:
        """Whether :meth:`get_epsilon` answers with the weighted heuristic now (settings
        that change the per-step weights were recorded for every step)."""
        return self._weights_in_use()

    def stays_constant_rate(self, settings: StepSettings | None) -> bool:
        """Whether more steps with ``settings`` keep :meth:`get_epsilon` on the
        constant-rate formula."""
        if self._weights_in_use():
            return False
        if isinstance(settings, AdaptiveStep):
            return self._trace_disabled
        if settings is None or self._trace_disabled:
            return True
        if self._trace.covered != self._steps():  # the trace does not cover the run
            return True
        last = self._trace.last
        same_rate = last is None or last[0] == settings.lr
        return settings.momentum == 0.0 and settings.weight_decay == 0.0 and same_rate

    @synchronized
    def replay_step(
        self, noise_multiplier: float, sample_rate: float, settings: StepSettings | None
    ) -> None:
        """Record a step as the optimizer hook records it, from values another accountant
        recorded (:attr:`last_step`, :attr:`last_settings`): ``settings`` None means that the
        step's SGD settings are unknown, and the weighted heuristic is then off for good.

        Raises:
            TypeError, ValueError: on an invalid argument; nothing is recorded then.
        """
        sigma, q = check_step_noise(noise_multiplier), check_sample_rate(sample_rate)
        if settings is not None and not isinstance(settings, (SGDSettings, AdaptiveStep)):
            raise TypeError(
                "`settings` must be an SGDSettings, an AdaptiveStep or None, got "
                f"{type(settings).__name__}."
            )
        self._note_settings(settings, 1)
        self._record(sigma, q)

    def _note_settings(self, settings: StepSettings | None, steps: int) -> None:
        if self._trace_disabled:
            return
        adaptive = isinstance(settings, AdaptiveStep)
        if settings is None or (len(self._trace) if adaptive else len(self._adaptive)):
            self._disable_trace()  # unknown, or another kind of optimizer than before
        elif isinstance(settings, AdaptiveStep):
            self._adaptive.append(settings, steps)
        else:
            self._append_settings(settings.as_tuple(), steps)

    @synchronized
    def replay_steps(
        self,
        noise_multiplier: float | Sequence[float],
        sample_rate: float,
        settings: StepSettings | None,
        count: int,
        *,
        delta: float,
    ) -> np.ndarray | None:
        """Record ``count`` steps at (sigma, q) with ``settings`` (as :meth:`replay_step`;
        ``noise_multiplier``: one sigma, or one per step) and return the heuristic epsilon at
        ``delta`` after each: :meth:`get_epsilon`'s values step by step (to the root finder's
        tolerance, about 1e-13 relative), solved together, with the same warnings (a run of
        several segments: the monotonicity checks its steps' queries would have started).

        Returns:
            The ``count`` epsilons; None, with nothing recorded, where only the step-by-step
            path applies: noise 0, batches in epochs, the weighted heuristic, settings that
            would leave the constant-rate formula, a history assigned from outside, or a
            single-segment monotonicity check with shorter runs left to sweep.
        """
        n = check_int("count", count, minimum=1)
        sigmas = check_step_noises(noise_multiplier, n)
        q, d = check_sample_rate(sample_rate), check_delta(delta)
        if not (
            float(sigmas.min()) > 0.0
            and self._unit.single_record
            and not self._externally_assigned
            and not self.uses_epoch_sampling
            and not self._weights_in_use()
            and self.stays_constant_rate(settings)
        ):
            return None
        first, segs = float(sigmas[0]), self._segments
        single = bool(np.all(sigmas == first)) and (not segs or (
            len(segs) == 1 and (segs[0].noise_multiplier, segs[0].sample_rate) == (first, q)))
        sweep = None
        if single:
            ready, sweep = self._monotonicity.batch_sweep(d, segs, first, q, self._num_steps)
            if not ready:
                return None
        self._note_settings(settings, n)
        covered = not self._trace_disabled and self._trace.covered == self._steps() + n
        for sigma, steps in runs_of(sigmas):
            self._extend_segments(sigma, q, steps)
        kept = self._kept_model()
        peak = kept.suffix_peak(d)
        eps = kept.advance(sigmas, q, n, d, settings if covered else None)
        if sweep is not None:  # get_epsilon's single-segment check, every step at once
            self._monotonicity.check(d, eps, self._num_steps - n + 1, peak, sweep)
        elif not single:
            self._monotonicity.after_batch(d, eps, self._segments, self._num_steps)
        return eps

    def _trimmed_state(self, state: dict[str, Any], steps: int) -> dict[str, Any]:
        state = super()._trimmed_state(state, steps)
        state.pop("weighted_characteristic", None)  # a cache of the longer run
        stored = state.get("optimizer_trace")
        if stored is not None:  # a trace covers the run's last steps when it covers any
            trace = decode_trace(stored, "state_dict['optimizer_trace']").entries()
            state["optimizer_trace"] = encode_trace(trim_trace(trace, steps))
        stored = state.get("adaptive_trace")
        if stored is not None:
            adaptive = decode_adaptive_trace(stored, "state_dict['adaptive_trace']")
            state["adaptive_trace"] = encode_adaptive_trace(adaptive.trimmed(steps))
        return state

    @synchronized
    def weighted_result(self, delta: float) -> WeightedHeuristicResult:
        """The schedule/momentum-weighted heuristic with its achieved accuracy (cached for
        the current number of steps). Requires recorded optimizer settings. ``value`` is an
        upper bound with a certified lower bound within :attr:`weight_accuracy` relative
        (the characteristic function kept step by step where it applies, else from scratch)."""
        d = check_delta(delta)
        if not self._weights_in_use():
            raise ValueError(
                "no optimizer settings that change the weights were recorded for every step; "
                "get_epsilon uses the constant-rate formula."
            )
        return self._kept_model().weighted_result(d)

    def _extra_state(self) -> dict[str, Any]:
        # a trace that does not cover every step (steps recorded without the optimizer)
        # never weighs the steps: it is stored as what it amounts to, settings not used
        partial = (len(self._trace) > 0 and self._trace.covered != self._steps()) or (
            len(self._adaptive) > 0 and self._adaptive.covered != self._steps()
        )
        out: dict[str, Any] = {
            "optimizer_trace": encode_trace([] if partial else self._trace.columns()),
            "optimizer_trace_disabled": self._trace_disabled or partial,
            **unit_state(self._unit),  # absent for one record
        }
        if len(self._adaptive) and not partial:  # absent for SGD runs
            out["adaptive_trace"] = encode_adaptive_trace(self._adaptive)
        saved = self._kept.characteristic_state()
        if saved is not None:  # a cache: restored only onto the same run (its fingerprint)
            out["weighted_characteristic"] = saved
        return out

    def _check_extra_state(self, state_dict: Mapping[str, Any]) -> Any:
        state_unit(state_dict, self._unit)  # a state of another unit is refused
        trace, disabled, adaptive = decode_traces(state_dict)
        saved = state_dict.get("weighted_characteristic")
        if saved is not None and not isinstance(saved, Mapping):
            raise TypeError(
                "`state_dict['weighted_characteristic']` must be a mapping (a state_dict "
                f"of this accountant) or absent, got {type(saved).__name__}."
            )
        return trace, disabled, saved, adaptive

    def _load_extra_state(self, checked: Any) -> None:
        columns, self._trace_disabled, saved, adaptive = checked
        self._trace = SettingsTrace(columns)
        self._adaptive = adaptive  # validated and new: taken over
        self._last_settings = None
        self._calibration_warned = self._caveats_warned = False
        covers = not self._trace_disabled and len(self._trace) and (
            self._trace.covered == self._steps()
        )
        # as columns, taken in at once by the kept model: no Python object per step
        settings: TraceColumns | AdaptiveColumns | None = self._trace.columns() if covers else None
        if len(adaptive) and not self._trace_disabled:
            settings = self._adaptive.columns()
        self._kept = KeptModel.from_run(self.run, settings, accuracy=self.weight_accuracy)
        # the saved accountant was answering weighted queries: restore its engine now (O(T)
        # bookkeeping, with the rest of the load), so that the next query costs what it
        # would have cost without the checkpoint
        self._kept.restore_characteristic(saved)

    # -- privacy ----------------------------------------------------------------------------

    def _warn_if_calibrating(self, robust: bool) -> None:
        if self._externally_assigned and not self._calibration_warned:
            self._calibration_warned = True
            which = (
                "the robust last-iterate heuristic epsilon"
                if robust
                else "the plain last-iterate heuristic epsilon (pass robust=True to "
                "make_private_with_epsilon to calibrate the robust value, the one to report)"
            )
            if not robust and self.adaptive_optimizer is not None:  # a calibration's plan
                which = f"the last-iterate {ADAPTIVE_HEURISTIC_LABEL} ({self.adaptive_optimizer})"
            warn(
                "LastIterateAccountant.history was assigned directly, as Opacus's "
                "get_noise_multiplier (make_private_with_epsilon) does to calibrate the noise: "
                f"the noise multiplier is being chosen to meet a target on {which}. That "
                "number is exact only for linear losses; it is not a "
                "differential-privacy guarantee for non-linear models such as deep networks, "
                "and it covers the final model only. (Use load_state_dict to restore a saved "
                "history without this warning.)",
                HeuristicCalibrationWarning,
            )

    @property
    def uses_epoch_sampling(self) -> bool:
        """Whether the run's batches come in epochs (shuffled, deterministic, balls-in-bins),
        so the heuristic is the per-scheme one and not the Poisson formula."""
        scheme = effective_sampling(self.sampling)
        return scheme is not None and not isinstance(scheme, PoissonSampling)

    @synchronized
    def get_epsilon(
        self, delta: float, *, robust: bool = False, check_monotone: bool = True
    ) -> float:
        """Heuristic epsilon of the final model at ``delta`` (``docs/last_iterate.md``), for
        the run's sampling scheme (:attr:`sampling`: Poisson unless ``make_private`` saw
        another loader or one was declared; ``docs/samplers.md``) and its :attr:`unit`
        (``docs/privacy_units.md``: one record unless stated).

        With optimizer settings recorded by the hook for every step (varying learning rate,
        momentum or weight decay), this is the weighted heuristic, rounded up to within
        :attr:`weight_accuracy`; otherwise the constant-rate formula, answered incrementally.
        For an adaptive optimizer (Adam, AdamW, ...: :attr:`adaptive_optimizer`) it is the
        weighted heuristic with the optimizer's frozen-second-moment weights, labelled
        :attr:`heuristic_label` (``docs/adaptive_optimizers.md``), also while
        ``make_private_with_epsilon`` calibrates such a run (with the planned settings). A
        recorded step without noise makes it inf (:class:`ZeroNoiseWarning`).

        Args:
            delta: target delta, in (0, 1).
            robust: if True, return the certified max over the last t <= T steps of the
                heuristic epsilon ("Robust variant"; the constant-rate formula). Opacus's
                ``make_private_with_epsilon`` forwards ``robust=True`` here when given it
                (``docs/opacus_integration.md``, "Calibration").
            check_monotone: warn (:class:`NonMonotoneHeuristicWarning`) when eps_T is below
                the epsilon of a shorter suffix
                (:class:`~opacus_lastiterate.accountants.monotonicity.MonotonicityWatch`);
                skipped when recorded schedule/momentum weights are in use.

        Returns:
            The heuristic epsilon (:attr:`heuristic_label` says which); 0.0 for an empty
            history. Not a proven DP bound for deep networks.

        Raises:
            TypeError: for a keyword this method does not take (Opacus forwards every
                keyword of ``make_private_with_epsilon``; a misspelt one is not ignored).
            ValueError: ``robust=True`` with a unit of more than one record (no model).
        """
        d = check_delta(delta)
        if not isinstance(robust, bool):
            raise TypeError(f"`robust` must be a bool, got {robust!r}.")
        if not isinstance(check_monotone, bool):
            raise TypeError(f"`check_monotone` must be a bool, got {check_monotone!r}.")
        self._warn_if_calibrating(robust)
        kept = self._kept_model()
        name = "robust_heuristic" if robust else "heuristic"
        eps = kept.epsilon(d, name)
        if not robust and not self._caveats_warned and self._adaptive_in_use():
            self._caveats_warned = True  # once per run
            # the kept model's columns: the same steps, no new object per run
            if (columns := kept.adaptive_columns) is not None:
                warn_adaptive_caveats(columns, self._segments, self._num_steps)
        if (
            check_monotone
            and not self._externally_assigned
            and self._num_steps
            and kept.choice(name).kept == "constant"
        ):
            self._monotonicity.after_query(d, eps, self._segments, self._num_steps, kept)
        return eps

    @synchronized
    def get_delta(self, epsilon: float) -> float:
        """Heuristic delta(epsilon) of the final model.

        Args:
            epsilon: in [0, inf).

        Returns:
            The heuristic delta; 0.0 for an empty history, 1.0 when no step had noise.
        """
        eps = check_epsilon(epsilon)
        self._warn_if_calibrating(False)
        return self._kept_model().delta(eps)

    # -- display ----------------------------------------------------------------------------

    def describe(self, delta: float | None = None) -> str:
        """A human-readable summary that says what the number is and is not
        (:func:`~.summary.summary`; with ``delta``, the heuristic epsilon at it)."""
        return summary(self, delta)

    def __repr__(self) -> str:
        return f"LastIterateAccountant(num_steps={self.num_steps}, segments={len(self)}; {CAVEAT})"
