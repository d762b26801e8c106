"""An Opacus accountant that reports the last-iterate heuristic epsilon of the final model.

The number is the heuristic of Steinke et al., "The Last Iterate Advantage" (ICLR 2025,
arXiv 2410.06186; ``docs/last_iterate.md``):
for a history of segments (sigma_i, q_i, T_i) at a constant learning rate,

    P = sum_i Binomial(T_i, q_i) + N(0, sum_i T_i sigma_i^2),   Q = N(0, sum_i T_i sigma_i^2),
    eps(delta) = min{eps >= 0 : max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) <= delta}.

It is exact for linear losses and a *heuristic* otherwise: it is not a proven
differential-privacy bound for deep networks, and it describes the release of the final
model only (intermediate checkpoints are covered only by a standard composition bound).
The mathematics lives in :mod:`opacus_lastiterate.analysis.last_iterate.heuristic`; this module only
keeps Opacus's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants.base import RunAccountant, check_step_noise, synchronized
from opacus_lastiterate.accountants.monotonicity import MonotonicityWatch
from opacus_lastiterate.accountants.optimizer_trace import (
    SettingsTrace,
    TraceEntry,
    check_trace_covers,
    decode_trace,
    encode_trace,
    trim_trace,
)
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
    check_int,
    check_sample_rate,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.incremental import IncrementalHeuristic
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings, sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import WeightedHeuristicResult
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import PoissonSampling, effective_sampling
from opacus_lastiterate.analysis.sampling_heuristic import (
    RobustSamplingHeuristic,
    SamplingHeuristic,
)
from opacus_lastiterate.exceptions import (
    HeuristicCalibrationWarning,
    OptimizerTraceWarning,
)

__all__ = [
    "MECHANISM",
    "LastIterateAccountant",
]

MECHANISM = "last_iterate"


_CAVEAT = (
    "last-iterate heuristic (Steinke et al., ICLR 2025) for the final model only; "
    "exact for linear losses, not a proven DP bound for deep networks"
)


class LastIterateAccountant(RunAccountant):
    """Opacus accountant for the last-iterate heuristic epsilon of the final model.

    Use it by name once :mod:`opacus_lastiterate` is imported
    (``PrivacyEngine(accountant="last_iterate")``), or assign an instance to
    ``engine.accountant`` before ``make_private``.

    Per-step accounting is incremental (:class:`~opacus_lastiterate.analysis.last_iterate.incremental.
    IncrementalHeuristic`): asking for epsilon after every step costs a warm-started root
    find, not a computation from scratch.

    Attributes:
        history: ``(noise_multiplier, sample_rate, num_steps)`` segments, oldest first,
            run-length merged like Opacus's ``RDPAccountant`` (a copy; assign to replace).

    Note:
        ``len(accountant)`` is the number of history *segments*, as in every Opacus
        accountant (``PrivacyEngine.make_private_with_epsilon`` only tests it for > 0);
        use :attr:`num_steps` for the number of steps.
    """

    _MECHANISM = MECHANISM

    def __init__(self, *, weight_accuracy: float = 1e-3) -> None:
        """Create an accountant with an empty history (Opacus's registry calls ``cls()``).

        Args:
            weight_accuracy: requested relative accuracy of the schedule/momentum-weighted
                epsilon, in (0, 1) (:attr:`weight_accuracy`).
        """
        accuracy = check_in_interval("weight_accuracy", weight_accuracy, 0.0, 1.0)
        self._engine = IncrementalHeuristic()
        self._calibration_warned = False
        self._trace = SettingsTrace()
        self._trace_disabled = False
        self._weighted_cache: tuple[tuple[int, float], WeightedHeuristicResult] | None = None
        self._weighted_engine: IncrementalWeightedHeuristic | None = None
        # the weighted engine's characteristic function from a loaded state, taken up when
        # the engine is next built (ignored unless saved for the same run)
        self._saved_characteristic: Mapping[str, Any] | None = None
        self._monotonicity = MonotonicityWatch()
        self.weight_accuracy = accuracy
        """Requested relative accuracy of the schedule/momentum-weighted epsilon."""
        self._last_settings: SGDSettings | None = None  # last_settings, built when asked
        super().__init__()

    # -- bookkeeping hooks (see RunAccountant) ----------------------------------------------

    def _after_step(self, noise_multiplier: float, sample_rate: float) -> None:
        self._engine.append(noise_multiplier, sample_rate)
        engine = self._weighted_engine
        if engine is not None:  # keep the weighted engine in step with the trace
            if self._trace_disabled or engine.num_steps + 1 != self._steps() or not self._trace:
                self._weighted_engine = None
            else:
                last = self._trace.last
                assert last is not None  # the trace is not empty
                engine.append(noise_multiplier, sample_rate, *last)
        elif self._weights_in_use():
            # from the first step whose weights matter the engine follows the steps (O(1)
            # each), so that the first query does not take in the whole trace (O(T))
            self._weighted_engine_in_sync()

    def _after_reset(self) -> None:
        self._engine = IncrementalHeuristic.from_run(self.run)
        self._trace = SettingsTrace()  # a history written from outside has no optimizer settings
        self._last_settings = None
        self._weighted_cache = None
        self._weighted_engine = None
        self._saved_characteristic = None
        self._monotonicity = MonotonicityWatch()

    def _steps(self) -> int:
        return self._num_steps

    # -- optimizer settings (learning-rate schedules, momentum) -----------------------------

    def _observe(self, optim: Any) -> None:
        """Read the SGD settings of this step (Opacus calls the hook in ``pre_step``, before
        the update, so the learning rate read is the one this step uses)."""
        self._record_optimizer(optim)

    def _record_optimizer(self, optim: Any) -> None:
        if self._trace_disabled:
            return
        from opacus_lastiterate.schedules import sgd_settings  # torch side

        try:
            st = sgd_settings(optim)
        except ValueError as err:  # UnsupportedOptimizerError or differing parameter groups
            self._trace_disabled, self._trace = True, SettingsTrace()
            warn(
                f"{err} The last-iterate accountant falls back to the constant-rate formula, "
                "which does not describe this optimizer.",
                OptimizerTraceWarning,
            )
            return
        self._append_settings((st.lr, st.momentum, st.dampening, st.nesterov, st.weight_decay))

    def _append_settings(self, key: tuple[float, float, float, bool, float], steps: int = 1) -> None:
        """Add ``steps`` steps with SGD settings ``key`` to the run-length encoded trace."""
        if self._trace.append(key, steps):
            self._last_settings = None

    @property
    def optimizer_trace(self) -> list[TraceEntry]:
        """Recorded SGD settings, run-length encoded: (lr, momentum, dampening, nesterov,
        weight_decay, steps). Empty unless the accountant's hook saw the optimizer."""
        return self._trace.entries()

    def _weights_in_use(self) -> bool:
        """True if the recorded settings change the weights of the steps in the final model
        (varying learning rate, momentum or weight decay) and cover every recorded step."""
        if self._trace_disabled or not self._trace:
            return False
        steps, varies = self._trace_summary()
        return steps == self._steps() and varies

    def _trace_summary(self) -> tuple[int, bool]:
        """(steps covered by the trace, whether its settings change the weights), kept up to
        date as the trace grows, so that a step does not rescan the whole trace."""
        return self._trace.covered, self._trace.varies

    def _weighted_run(self) -> DPSGDRun:
        """The recorded run with the per-step weights of the recorded SGD settings."""
        c = self._trace.columns()
        weights = sgd_weights(
            np.repeat(c.lr, c.steps),
            momentum=np.repeat(c.momentum, c.steps),
            dampening=np.repeat(c.dampening, c.steps),
            nesterov=bool(c.nesterov.any()),
            weight_decay=np.repeat(c.weight_decay, c.steps),
        )
        weights.setflags(write=False)
        return DPSGDRun._trusted(self.run.segments, weights)

    def _weighted_engine_in_sync(self) -> IncrementalWeightedHeuristic:
        """The incremental weighted engine for the recorded trace; rebuilt from the trace
        and the run when it is missing (loaded state, assigned history) or out of step."""
        engine = self._weighted_engine
        if (
            engine is None
            or engine.num_steps != self._steps()
            or engine.accuracy != self.weight_accuracy
        ):
            engine = IncrementalWeightedHeuristic(self.weight_accuracy)
            sigma, q = self.run.per_step()
            if len(self._trace):
                columns = self._trace.columns()
                first = columns.settings_at(0)
                engine.append(float(sigma[0]), float(q[0]), *first)
                counts = columns.steps.copy()
                fields = list(columns[:5])
                total = int(counts.sum())
                counts[0] -= 1
                engine.extend(sigma[1:total], q[1:total], *(np.repeat(f, counts) for f in fields))
            saved, self._saved_characteristic = self._saved_characteristic, None
            if saved is not None:
                engine.restore_characteristic(saved)
            self._weighted_engine = engine
        return engine

    # -- the incremental API: what a replica of the accountant is fed ----------------------

    @property
    def last_settings(self) -> SGDSettings | None:
        """The SGD settings the hook read at the last recorded step; None when the settings
        of the steps are not recorded (no optimizer seen, or one whose settings the
        heuristic cannot use). The same object while the settings stay the same."""
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

    def stays_constant_rate(self, settings: SGDSettings | None) -> bool:
        """Whether more steps with ``settings`` keep :meth:`get_epsilon` on the
        constant-rate formula."""
        if self._weights_in_use():
            return False
        if settings is None or self._trace_disabled:
            return True
        steps, _ = self._trace_summary()
        if steps != self._steps():  # the trace does not cover the run
            return True
        last = self._trace.last
        same_rate = last is None or last[0] == settings.lr
        return settings.momentum == 0.0 and settings.weight_decay == 0.0 and same_rate

    @synchronized
    def replay_step(
        self, noise_multiplier: float, sample_rate: float, settings: SGDSettings | None
    ) -> None:
        """Record a step as the optimizer hook records it, from values another accountant
        recorded (:attr:`last_step`, :attr:`last_settings`): ``settings`` None means that the
        step's SGD settings are unknown, and the weighted heuristic is then off for good.

        Raises:
            TypeError, ValueError: on an invalid argument; nothing is recorded then.
        """
        sigma, q = check_step_noise(noise_multiplier), check_sample_rate(sample_rate)
        if settings is not None and not isinstance(settings, SGDSettings):
            raise TypeError(
                f"`settings` must be an SGDSettings or None, got {type(settings).__name__}."
            )
        self._note_settings(settings, 1)
        self._record(sigma, q)

    def _note_settings(self, settings: SGDSettings | None, steps: int) -> None:
        if settings is None:
            if not self._trace_disabled:
                self._trace_disabled, self._trace = True, SettingsTrace()
                self._last_settings = None
        elif not self._trace_disabled:
            self._append_settings(settings.as_tuple(), steps)

    @synchronized
    def replay_steps(
        self,
        noise_multiplier: float,
        sample_rate: float,
        settings: SGDSettings | None,
        count: int,
        *,
        delta: float,
    ) -> np.ndarray | None:
        """Record ``count`` steps at (sigma, q) with ``settings`` (as :meth:`replay_step`)
        and return the heuristic epsilon at ``delta`` after each: the values that
        :meth:`replay_step` and :meth:`get_epsilon` give step by step (to the root finder's
        tolerance, about 1e-13 relative), solved together
        (:meth:`IncrementalHeuristic.advance`), with the same warnings.

        Returns:
            The ``count`` epsilons; None, with nothing recorded, where only the step-by-step
            path applies: noise 0, batches in epochs (:attr:`uses_epoch_sampling`), the
            weighted heuristic, settings that would leave the
            constant-rate formula, a history assigned from outside, or a monotonicity check
            that is not the single-segment one with nothing left to sweep.
        """
        sigma, q = check_step_noise(noise_multiplier), check_sample_rate(sample_rate)
        n = check_int("count", count, minimum=1)
        d = check_delta(delta)
        if not (
            sigma > 0.0
            and not self._externally_assigned
            and not self.uses_epoch_sampling
            and not self._weights_in_use()
            and self.stays_constant_rate(settings)
        ):
            return None
        ready, sweep = self._monotonicity.batch_sweep(d, self._segments, sigma, q, self._num_steps)
        if not ready:
            return None
        self._note_settings(settings, n)
        self._extend_segments(sigma, q, n)
        self._weighted_engine = None  # rebuilt from the trace if ever needed
        peak = self._engine.suffix_peak(d)
        eps = self._advance(sigma, q, n, d)
        if sweep is not None:  # get_epsilon's single-segment check, every step at once
            self._monotonicity.check(d, eps, self._num_steps - n + 1, peak, sweep)
        return eps

    def _advance(self, sigma: float, q: float, steps: int, delta: float) -> np.ndarray:
        """:meth:`IncrementalHeuristic.advance` for the last ``steps`` recorded steps, in
        batches of at most as many steps as came before (at least 16): the batch solve
        extrapolates from the last solves, which holds over a batch as long as the run so far
        but not over a much longer one (a batch of 10^4 steps from the first step went one
        step at a time: 0.59 ms a step, against 57 us in doubling batches)."""
        parts, done, before = [], 0, self._num_steps - steps
        while done < steps:
            chunk = min(steps - done, max(16, before + done))
            parts.append(self._engine.advance(sigma, q, chunk, delta))
            done += chunk
        return np.concatenate(parts)

    def _trimmed_state(self, state: dict[str, Any], steps: int) -> dict[str, Any]:
        state = super()._trimmed_state(state, steps)
        state.pop("weighted_characteristic", None)  # a cache of the longer run
        stored = state.get("optimizer_trace")
        if stored is not None:  # a trace covers the run's last steps when it covers any
            trace = decode_trace(stored, "state_dict['optimizer_trace']").entries()
            state["optimizer_trace"] = encode_trace(trim_trace(trace, steps))
        return state

    @synchronized
    def weighted_result(self, delta: float) -> WeightedHeuristicResult:
        """The schedule/momentum-weighted heuristic with its achieved accuracy (cached for
        the current number of steps). Requires recorded optimizer settings.

        Answered by :class:`~opacus_lastiterate.analysis.last_iterate.incremental_weighted.
        IncrementalWeightedHeuristic`: the characteristic function kept step by step (SGD
        without weight decay at one momentum, dampening and nesterov setting), else from
        scratch. Either way ``value`` is an upper bound with a certified lower bound within
        :attr:`weight_accuracy` relative."""
        d = check_delta(delta)
        if not self._weights_in_use():
            raise ValueError(
                "no optimizer settings that change the weights were recorded for every step; "
                "get_epsilon uses the constant-rate formula."
            )
        key = (self._steps(), d)
        if self._weighted_cache is None or self._weighted_cache[0] != key:
            self._weighted_cache = (key, self._weighted_engine_in_sync().epsilon(d))
        return self._weighted_cache[1]

    def _extra_state(self) -> dict[str, Any]:
        # a trace that does not cover every step (steps recorded without the optimizer)
        # never weighs the steps: it is stored as what it amounts to, settings not used
        partial = len(self._trace) > 0 and self._trace.covered != self._steps()
        out: dict[str, Any] = {
            "optimizer_trace": encode_trace([] if partial else self._trace.columns()),
            "optimizer_trace_disabled": self._trace_disabled or partial,
        }
        engine = self._weighted_engine
        saved = self._saved_characteristic
        if engine is not None and engine.num_steps == self._steps():
            saved = engine.characteristic_state()
        if saved is not None:  # a cache: restored only onto the same run (its fingerprint)
            out["weighted_characteristic"] = saved
        return out

    def _check_extra_state(self, state_dict: Mapping[str, Any]) -> Any:
        stored = state_dict.get("optimizer_trace")
        trace = None if stored is None else decode_trace(stored, "state_dict['optimizer_trace']")
        disabled = state_dict.get("optimizer_trace_disabled", False)
        if not isinstance(disabled, bool):
            raise TypeError(
                f"`state_dict['optimizer_trace_disabled']` must be a bool, got {disabled!r}."
            )
        check_trace_covers(
            [] if trace is None else trace.steps, state_dict["history"], disabled,
            "state_dict['optimizer_trace']",
        )  # fmt: skip
        saved = state_dict.get("weighted_characteristic")
        if saved is not None and not isinstance(saved, Mapping):
            raise TypeError(
                "`state_dict['weighted_characteristic']` must be a mapping (a state_dict "
                f"of this accountant) or absent, got {type(saved).__name__}."
            )
        return trace, disabled, saved

    def _load_extra_state(self, checked: Any) -> None:
        columns, self._trace_disabled, self._saved_characteristic = checked
        self._trace = SettingsTrace(columns)
        self._last_settings = None
        self._calibration_warned = False
        if self._saved_characteristic is not None:
            # the saved accountant was answering weighted queries: restore its engine now
            # (O(T) bookkeeping, with the rest of the load), so that the next query costs
            # what it would have cost without the checkpoint
            if self._weights_in_use():
                self._weighted_engine_in_sync()
            self._saved_characteristic = None

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

    def _epoch_scheme_model(self, robust: bool) -> PrivacyModel | None:
        """The heuristic of a run whose batches come in epochs (shuffled, deterministic,
        balls-in-bins: :attr:`sampling`, ``docs/samplers.md``); None for Poisson."""
        if not self.uses_epoch_sampling:
            return None
        if robust:
            return RobustSamplingHeuristic(self.run)
        weights = self._weighted_run().weights if self._weights_in_use() else None
        run = DPSGDRun._trusted(self.run.segments, weights, sampling=self.sampling)
        return SamplingHeuristic(run, accuracy=self.weight_accuracy)

    @synchronized
    def get_epsilon(
        self, delta: float, *, robust: bool = False, check_monotone: bool = True
    ) -> float:
        """Heuristic epsilon of the final model at ``delta`` (``docs/last_iterate.md``), for
        the run's sampling scheme (:attr:`sampling`: Poisson unless ``make_private`` saw
        another loader or one was declared; ``docs/samplers.md``).

        With optimizer settings recorded by the hook for every step (varying learning rate,
        momentum or weight decay), this is the weighted heuristic, rounded up to within
        :attr:`weight_accuracy`; otherwise the constant-rate formula, answered incrementally.
        A recorded step without noise makes it inf (:class:`ZeroNoiseWarning`).

        Args:
            delta: target delta, in (0, 1).
            robust: if True, return the certified max over the last t <= T steps of the
                heuristic epsilon ("Robust variant"); this uses the constant-rate formula.
                The same default however the history was written: Opacus's
                ``make_private_with_epsilon`` calibrates to the plain value unless it is
                given ``robust=True``, which it forwards here (``docs/opacus_integration.md``,
                "Calibration").
            check_monotone: warn (:class:`NonMonotoneHeuristicWarning`) when eps_T is below
                the epsilon of a shorter suffix
                (:class:`~opacus_lastiterate.accountants.monotonicity.MonotonicityWatch`);
                skipped when recorded schedule/momentum weights are in use.

        Returns:
            The heuristic epsilon; 0.0 for an empty history. Not a proven DP bound for deep
            networks.

        Raises:
            TypeError: for a keyword this method does not take (Opacus forwards every
                keyword of ``make_private_with_epsilon``; a misspelt one is not ignored).
        """
        d = check_delta(delta)
        if not isinstance(robust, bool):
            raise TypeError(f"`robust` must be a bool, got {robust!r}.")
        if not isinstance(check_monotone, bool):
            raise TypeError(f"`check_monotone` must be a bool, got {check_monotone!r}.")
        self._warn_if_calibrating(robust)
        if self._num_steps == 0:
            return 0.0
        epoch_model = self._epoch_scheme_model(robust)
        if epoch_model is not None:
            return float(epoch_model.epsilon(d))
        if robust:
            return float(RobustLastIterateHeuristic(self.run).epsilon(d))
        if self._weights_in_use():
            return float(self.weighted_result(d).epsilon)
        eps = self._engine.epsilon(d)
        if check_monotone and not self._externally_assigned:
            self._monotonicity.after_query(d, eps, self._segments, self._num_steps, self._engine)
        return float(eps)

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
        if self._num_steps == 0:
            return 0.0
        epoch_model = self._epoch_scheme_model(False)
        if epoch_model is not None:
            return float(epoch_model.delta(eps))
        if self._weights_in_use():
            model = LastIterateHeuristic(self._weighted_run(), accuracy=self.weight_accuracy)
            return float(model.delta(eps))
        return float(self._engine.delta(eps))

    # -- display ----------------------------------------------------------------------------

    def describe(self, delta: float | None = None) -> str:
        """A human-readable summary that says what the number is and is not.

        Args:
            delta: if given, include the heuristic epsilon at this delta.
        """
        lines = [f"LastIterateAccountant: {self.num_steps} steps in {len(self)} segment(s)."]
        if self._weights_in_use():
            lines.append(
                "Learning-rate schedule / momentum / weight decay recorded from the optimizer: "
                f"weighted heuristic, rounded up to within {self.weight_accuracy:g} relative."
            )
        else:
            lines.append(
                "Constant-rate formula (plain SGD at a constant learning rate"
                + ("; the optimizer's settings could not be used" if self._trace_disabled else "")
                + ")."
            )
        if delta is not None:
            d = check_delta(delta)
            eps = self.get_epsilon(d)
            lines.append(f"Heuristic epsilon at delta={d:g}: {eps:.4f}.")
            if not self._weights_in_use() and self._num_steps:
                robust = self.get_epsilon(d, robust=True)
                lines.append(
                    f"Robust heuristic epsilon (max over the last t <= T steps): {robust:.4f}"
                    + (" (above the plain value: report it)." if robust > eps * (1 + 1e-9) else ".")
                )
        lines.append(f"This is the {_CAVEAT}.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"LastIterateAccountant(num_steps={self.num_steps}, segments={len(self)}; {_CAVEAT})"
