"""An Opacus accountant that reports the last-iterate heuristic epsilon of the final model.

The number is the heuristic of Steinke et al. (ICLR 2025), reference note ``last-iterate.md``:
for a history of segments (sigma_i, q_i, T_i) at a constant learning rate,

    P = sum_i Binomial(T_i, q_i) + N(0, sum_i T_i sigma_i^2),   Q = N(0, sum_i T_i sigma_i^2),
    eps(delta) = min{eps >= 0 : max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) <= delta}.

It is exact for linear losses and a *heuristic* otherwise: it is not a proven
differential-privacy bound for deep networks, and it describes the release of the final
model only (intermediate checkpoints are covered only by a standard composition bound).
The mathematics lives in :mod:`opacus_lastiterate.analysis.heuristic`; this module only
keeps Opacus's bookkeeping.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from opacus.accountants import IAccountant

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis import heuristic as _heuristic
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
)
from opacus_lastiterate.analysis.counterexamples import heuristic_monotonicity_for_history
from opacus_lastiterate.analysis.history import as_segments
from opacus_lastiterate.analysis.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.weighted_heuristic import (
    WeightedHeuristicResult,
    weighted_heuristic_delta,
    weighted_heuristic_epsilon,
)
from opacus_lastiterate.exceptions import (  # defined there, re-exported here
    HeuristicCalibrationWarning,
    NonMonotoneHeuristicWarning,
    OptimizerTraceWarning,
)

__all__ = [
    "MECHANISM",
    "HeuristicCalibrationWarning",
    "LastIterateAccountant",
    "NonMonotoneHeuristicWarning",
    "OptimizerTraceWarning",
]

MECHANISM = "last_iterate"

History = list[tuple[float, float, int]]

_CAVEAT = (
    "last-iterate heuristic (Steinke et al., ICLR 2025) for the final model only; "
    "exact for linear losses, not a proven DP bound for deep networks"
)


# One run of identical optimizer settings: (lr, momentum, dampening, nesterov, weight_decay, steps)
TraceEntry = tuple[float, float, float, bool, float, int]


def _validate_trace(trace: object, name: str) -> list[TraceEntry]:
    """Validate a recorded optimizer trace (see :attr:`LastIterateAccountant.optimizer_trace`)."""
    if not isinstance(trace, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of 6-tuples, got {type(trace).__name__}.")
    out: list[TraceEntry] = []
    for i, entry in enumerate(trace):
        if not isinstance(entry, (list, tuple)) or len(entry) != 6:
            raise TypeError(
                f"`{name}[{i}]` must be (lr, momentum, dampening, nesterov, weight_decay, "
                f"steps), got {entry!r}."
            )
        lr, momentum, dampening, nesterov, weight_decay, steps = entry
        if not isinstance(nesterov, bool):
            raise TypeError(f"`{name}[{i}].nesterov` must be a bool, got {nesterov!r}.")
        out.append(
            (
                check_in_interval(f"{name}[{i}].lr", lr, 0.0, float("inf"), low_open=False),
                check_in_interval(f"{name}[{i}].momentum", momentum, 0.0, 1.0, low_open=False, high_open=False),
                check_in_interval(f"{name}[{i}].dampening", dampening, 0.0, 1.0, low_open=False, high_open=False),
                nesterov,
                check_in_interval(f"{name}[{i}].weight_decay", weight_decay, 0.0, float("inf"), low_open=False),
                check_steps(steps, f"{name}[{i}].steps", minimum=1),
            )
        )
    return out


def _validate_history(history: object, name: str = "history") -> History:
    """Return ``history`` as a new list of ``(float, float, int)``; raise on any bad entry.

    Each entry must be a triple ``(noise_multiplier, sample_rate, num_steps)`` with
    noise_multiplier in (0, inf), sample_rate in (0, 1] and num_steps an integer >= 1
    (checked by :func:`opacus_lastiterate.analysis.history.as_segments`).
    """
    if not isinstance(history, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of (noise_multiplier, sample_rate, num_steps) triples, "
            f"got {history!r} of type {type(history).__name__}."
        )
    for i, entry in enumerate(history):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise TypeError(
                f"`{name}[{i}]` must be a (noise_multiplier, sample_rate, num_steps) triple, "
                f"got {entry!r}."
            )
    segments = as_segments(history, name)
    for i, seg in enumerate(segments):
        if seg.steps < 1:
            raise ValueError(f"`{name}[{i}].steps` must be an integer >= 1, got {seg.steps}.")
    return [(s.noise_multiplier, s.sample_rate, s.steps) for s in segments]


def _mechanism_name(value: object) -> object:
    """The mechanism name stored in a state dict.

    Opacus < 1.6 stored the bound classmethod ``cls.mechanism`` instead of its result (fixed
    in Opacus PR #778); such a value is resolved to its name, anything else is returned as is.
    """
    if (
        inspect.ismethod(value)
        and isinstance(value.__self__, type)
        and issubclass(value.__self__, IAccountant)
    ):
        return value()
    return value


class LastIterateAccountant(IAccountant):
    """Opacus accountant for the last-iterate heuristic epsilon of the final model.

    Use it by name once :mod:`opacus_lastiterate.accountants` is imported
    (``PrivacyEngine(accountant="last_iterate")``), or assign an instance to
    ``engine.accountant`` before ``make_private``.

    Attributes:
        history: ``(noise_multiplier, sample_rate, num_steps)`` segments, oldest first,
            run-length merged like Opacus's ``RDPAccountant``.

    Note:
        ``len(accountant)`` is the number of history *segments*, as in every Opacus
        accountant (``PrivacyEngine.make_private_with_epsilon`` only tests it for > 0);
        use :attr:`num_steps` for the number of steps.
    """

    def __init__(self) -> None:
        """Create an accountant with an empty history (Opacus's registry calls ``cls()``)."""
        self._history: History = []
        self._externally_assigned = False
        self._calibration_warned = False
        self._trace: list[TraceEntry] = []
        self._trace_disabled = False
        self._weighted_cache: tuple[tuple[int, float], WeightedHeuristicResult] | None = None
        self._monotone_checked: dict[float, int] = {}
        self.weight_accuracy = 1e-3
        """Requested relative accuracy of the schedule/momentum-weighted epsilon."""
        super().__init__()  # IAccountant assigns ``self.history = []`` through the setter
        self._externally_assigned = False

    # -- state ------------------------------------------------------------------------------

    @property
    def history(self) -> History:
        """The recorded segments (the list itself, as in Opacus; see :meth:`get_epsilon`)."""
        return self._history

    @history.setter
    def history(self, value: History) -> None:
        # Opacus's get_noise_multiplier writes ``accountant.history = [(sigma, q, steps)]``
        # and then calls get_epsilon: remember that the history did not come from training.
        self._history = _validate_history(value)
        self._externally_assigned = True
        self._trace = []  # a history written from outside has no optimizer settings

    @property
    def num_steps(self) -> int:
        """Total number of optimizer steps recorded (the sum of the segments' num_steps)."""
        return sum(steps for _, _, steps in _validate_history(self._history))

    def _steps(self) -> int:
        """num_steps without re-validating: for callers that already ran _checked_history."""
        return sum(h[2] for h in self._history)

    @classmethod
    def mechanism(cls) -> str:
        """The name under which this accountant is registered: ``"last_iterate"``."""
        return MECHANISM

    def __len__(self) -> int:
        """Number of history segments, as Opacus defines it (not steps: see :attr:`num_steps`)."""
        return len(self._history)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one step; extend the last segment if (sigma, q) are unchanged.

        Args:
            noise_multiplier: noise standard deviation over clipping norm, in (0, inf).
            sample_rate: Poisson sampling rate, in (0, 1].

        Raises:
            TypeError, ValueError: on an invalid argument; the history is then unchanged.
        """
        sigma = check_noise_multiplier(noise_multiplier)
        q = check_sample_rate(sample_rate)
        if self._history and self._history[-1][0] == sigma and self._history[-1][1] == q:
            self._history[-1] = (sigma, q, self._history[-1][2] + 1)
        else:
            self._history.append((sigma, q, 1))

    # -- optimizer settings (learning-rate schedules, momentum) -----------------------------

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """Opacus's hook (records (sigma, q) per step) plus the optimizer's SGD settings.

        Opacus calls the hook in ``DPOptimizer.pre_step``, before the update, so the learning
        rate read is the one that step uses. Reading ``param_groups`` costs a few dict lookups.
        """
        record_step = super().get_optimizer_hook_fn(sample_rate)

        def hook_fn(optim: Any) -> None:
            record_step(optim)
            self._record_optimizer(optim)

        return hook_fn

    def _record_optimizer(self, optim: Any) -> None:
        if self._trace_disabled:
            return
        from opacus_lastiterate.schedules import sgd_settings  # torch side

        try:
            st = sgd_settings(optim)
        except ValueError as err:  # UnsupportedOptimizerError or differing parameter groups
            self._trace_disabled, self._trace = True, []
            warn(
                f"{err} The last-iterate accountant falls back to the constant-rate formula, "
                "which does not describe this optimizer.",
                OptimizerTraceWarning,
            )
            return
        key = (st.lr, st.momentum, st.dampening, st.nesterov, st.weight_decay)
        if self._trace and self._trace[-1][:5] == key:
            self._trace[-1] = (*key, self._trace[-1][5] + 1)
        else:
            self._trace.append((*key, 1))

    @property
    def optimizer_trace(self) -> list[TraceEntry]:
        """Recorded SGD settings, run-length encoded: (lr, momentum, dampening, nesterov,
        weight_decay, steps). Empty unless the accountant's hook saw the optimizer."""
        return list(self._trace)

    def _weights_in_use(self) -> bool:
        """True if the recorded settings change the weights of the steps in the final model
        (varying learning rate, momentum or weight decay) and cover every recorded step."""
        if self._trace_disabled or not self._trace:
            return False
        if sum(e[5] for e in self._trace) != self._steps():
            return False
        lrs = {e[0] for e in self._trace}
        return len(lrs) > 1 or any(e[1] != 0.0 or e[4] != 0.0 for e in self._trace)

    def _weighted_inputs(self) -> dict[str, Any]:
        """Per-step weights (``sgd_weights`` of the recorded settings), q_t and sigma_t."""
        counts = [e[5] for e in self._trace]
        steps = [h[2] for h in self._history]
        weights = sgd_weights(
            np.repeat([e[0] for e in self._trace], counts),
            momentum=np.repeat([e[1] for e in self._trace], counts),
            dampening=np.repeat([e[2] for e in self._trace], counts),
            nesterov=any(e[3] for e in self._trace),
            weight_decay=np.repeat([e[4] for e in self._trace], counts),
        )
        return dict(
            weights=weights,
            sample_rates=np.repeat([h[1] for h in self._history], steps),
            noise_multipliers=np.repeat([h[0] for h in self._history], steps),
            accuracy=self.weight_accuracy,
        )

    def weighted_result(self, delta: float) -> WeightedHeuristicResult:
        """The schedule/momentum-weighted heuristic with its achieved accuracy (cached for
        the current number of steps). Requires recorded optimizer settings."""
        d = check_delta(delta)
        if not self._weights_in_use():
            raise ValueError(
                "no optimizer settings that change the weights were recorded for every step; "
                "get_epsilon uses the constant-rate formula."
            )
        key = (self._steps(), d)
        if self._weighted_cache is None or self._weighted_cache[0] != key:
            self._weighted_cache = (key, weighted_heuristic_epsilon(d, **self._weighted_inputs()))
        return self._weighted_cache[1]

    def _warn_if_non_monotone(self, history: History, delta: float) -> None:
        """Warn when eps_T < max_{t<=T} eps_t. The check is a robust search, so it runs for
        each new delta and again whenever the number of steps has doubled since."""
        n = self._steps()
        last = self._monotone_checked.get(delta)
        if last is not None and n < 2 * last:
            return
        self._monotone_checked[delta] = n
        check = heuristic_monotonicity_for_history(history, delta)
        if check.non_monotone:
            warn(
                f"The last-iterate heuristic is not monotone here: eps_T = "
                f"{check.epsilon_at_steps:.4f} after T = {n} steps, but the last "
                f"{check.argmax_steps} steps alone give {check.max_epsilon:.4f}. A regulariser "
                "that zeroes the model would expose the larger value; report "
                "get_epsilon(delta, robust=True) beside it.",
                NonMonotoneHeuristicWarning,
            )

    def state_dict(self, destination: Any = None) -> Any:
        """Opacus-compatible state: ``{"history": [...], "mechanism": "last_iterate"}``.

        Args:
            destination: mapping to fill; a new ``OrderedDict`` if None.
        """
        if destination is None:
            destination = OrderedDict()
        destination["history"] = list(self._history)
        destination["mechanism"] = self.mechanism()
        destination["optimizer_trace"] = list(self._trace)
        destination["optimizer_trace_disabled"] = self._trace_disabled
        return destination

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state from :meth:`state_dict`, after validating all of it.

        Args:
            state_dict: mapping with keys ``"history"`` and ``"mechanism"``.

        Raises:
            TypeError, ValueError: if the state is missing, of another mechanism, or has an
                invalid history entry; the accountant is then unchanged.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"`state_dict` must be a mapping with keys 'history' and 'mechanism', "
                f"got {type(state_dict).__name__}."
            )
        for key in ("history", "mechanism"):
            if key not in state_dict:
                raise ValueError(
                    f"`state_dict` must have the key {key!r}, "
                    f"got keys {sorted(map(str, state_dict))}."
                )
        mechanism = _mechanism_name(state_dict["mechanism"])
        if mechanism != self.mechanism():
            raise ValueError(
                f"`state_dict['mechanism']` must be {self.mechanism()!r}, got {mechanism!r}: "
                "the state of another accountant cannot be loaded into LastIterateAccountant."
            )
        history = _validate_history(state_dict["history"], "state_dict['history']")
        trace = _validate_trace(
            state_dict.get("optimizer_trace", []), "state_dict['optimizer_trace']"
        )
        disabled = state_dict.get("optimizer_trace_disabled", False)
        if not isinstance(disabled, bool):
            raise TypeError(
                f"`state_dict['optimizer_trace_disabled']` must be a bool, got {disabled!r}."
            )
        self._history = history
        self._trace, self._trace_disabled = trace, disabled
        self._weighted_cache = None
        self._externally_assigned = False
        self._calibration_warned = False

    # -- privacy ----------------------------------------------------------------------------

    def _checked_history(self) -> History:
        history = _validate_history(self._history)  # Opacus may have written it directly
        if self._externally_assigned and not self._calibration_warned:
            self._calibration_warned = True
            warn(
                "LastIterateAccountant.history was assigned directly, as Opacus's "
                "get_noise_multiplier (make_private_with_epsilon) does to calibrate the noise: "
                "the noise multiplier is being chosen to meet a target on the last-iterate "
                "heuristic epsilon. That number is exact only for linear losses; it is not a "
                "differential-privacy guarantee for non-linear models such as deep networks, "
                "and it covers the final model only. (Use load_state_dict to restore a saved "
                "history without this warning.)",
                HeuristicCalibrationWarning,
            )
        return history

    def get_epsilon(
        self,
        delta: float,
        *,
        robust: bool = False,
        check_monotone: bool = True,
        **kwargs: Any,
    ) -> float:
        """Heuristic epsilon of the final model at ``delta`` (``last-iterate.md``, "Theorem").

        With optimizer settings recorded by the hook for every step (varying learning rate,
        momentum or weight decay), this is the weighted heuristic of ``last-iterate.md``,
        "Generalisations" item 2, rounded up to within :attr:`weight_accuracy`; otherwise the
        constant-rate formula.

        Args:
            delta: target delta, in (0, 1).
            robust: if True, return max over the last t <= T steps of the heuristic epsilon
                (``last-iterate.md``, "Robust variant"); this uses the constant-rate formula.
            check_monotone: warn (:class:`NonMonotoneHeuristicWarning`) when eps_T is below
                max_{t<=T} eps_t; checked per delta and again each time the steps double.
                The check uses the constant-rate formula, so it is skipped when recorded
                schedule/momentum weights are in use.
            **kwargs: ignored; accepted because Opacus forwards the keyword arguments of
                ``make_private_with_epsilon`` here.

        Returns:
            The heuristic epsilon; 0.0 for an empty history. Not a proven DP bound for deep
            networks.
        """
        d = check_delta(delta)
        for name, flag in (("robust", robust), ("check_monotone", check_monotone)):
            if not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be a bool, got {flag!r}.")
        history = self._checked_history()
        if not history:
            return 0.0
        if self._weights_in_use() and not robust:
            return float(self.weighted_result(d).epsilon)
        if check_monotone and not robust and not self._externally_assigned:
            self._warn_if_non_monotone(history, d)
        return float(_heuristic.heuristic_epsilon_for_history(history, d, robust=robust))

    def get_delta(self, epsilon: float) -> float:
        """Heuristic delta(epsilon) of the final model (``last-iterate.md``, "Theorem").

        Args:
            epsilon: in [0, inf).

        Returns:
            The heuristic delta; 0.0 for an empty history.
        """
        eps = check_epsilon(epsilon)
        history = self._checked_history()
        if not history:
            return 0.0
        if self._weights_in_use():
            return float(weighted_heuristic_delta(eps, **self._weighted_inputs()).delta)
        return float(_heuristic.heuristic_delta_for_history(history, eps))

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
            eps = self.get_epsilon(delta)
            lines.append(f"Heuristic epsilon at delta={check_delta(delta):g}: {eps:.4f}.")
        lines.append(f"This is the {_CAVEAT}.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        try:
            steps: object = self.num_steps
        except (TypeError, ValueError):
            steps = "invalid history"
        return f"LastIterateAccountant(num_steps={steps}, segments={len(self)}; {_CAVEAT})"
