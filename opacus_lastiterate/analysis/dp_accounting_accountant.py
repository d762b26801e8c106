"""The last-iterate heuristic as a ``dp_accounting`` accountant (``docs/beyond_opacus.md``).

:class:`LastIterateHeuristicAccountant` is a :class:`dp_accounting.PrivacyAccountant`: every
composed event is read as DP-SGD steps of one run, oldest first, turned into a
:class:`~.run.DPSGDRun` (one segment per maximal run of equal (noise multiplier, sample rate))
and answered by the registry's ``privacy_model("heuristic", run)`` (or
``"robust_heuristic"``). Supported events (``docs/beyond_opacus.md``, "The events it reads";
anything else: ``supports`` is False and ``compose`` raises
:class:`dp_accounting.UnsupportedEventError`): ``PoissonSampledDpEvent`` and ``GaussianDpEvent``
(q = 1) of a ``GaussianDpEvent``; ``SampledWithoutReplacementDpEvent(N, b, ...)`` only under
``REPLACE_SPECIAL`` (the Poisson pair at q = b / N); their ``SelfComposedDpEvent`` and
``ComposedDpEvent``; ``NoOpDpEvent`` (no step) and ``NonPrivateDpEvent`` (epsilon = inf, delta
= 1 from then on). ``REPLACE_ONE`` is refused at construction. Momentum and learning-rate
schedules enter through the constructor's ``weights`` (a sequence, one weight per composed
step, or a callable of the number of steps T returning the T weights; ``docs/beyond_opacus.md``,
"Momentum and learning-rate schedules").

What the number is: a heuristic for the final model only (exact for linear losses, not a
proven DP bound for deep networks; intermediate models are not covered), the label of
:attr:`LastIterateHeuristicAccountant.label`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_in_interval,
    check_int,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_models import PRIVACY_MODELS, privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

__all__ = [
    "LastIterateHeuristicAccountant",
]

WeightsLike = Sequence[float] | np.ndarray | Callable[[int], Sequence[float] | np.ndarray]
"""The ``weights`` keyword: per-step weights, or a function of the number of steps T that
returns T weights (module docstring)."""

_Details: TypeAlias = PrivacyAccountant.CompositionErrorDetails
_RELATIONS = (NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL)


def _check_weights_array(value: object) -> np.ndarray:
    try:
        w = np.array(value, dtype=float, copy=True)
    except (TypeError, ValueError):
        raise TypeError(
            f"`weights` must be a sequence of real numbers or a callable, got {value!r}."
        ) from None
    if w.ndim != 1:
        raise ValueError(f"`weights` must be one-dimensional, got shape {w.shape}.")
    if not np.all(np.isfinite(w) & (w >= 0)):
        bad = int(np.flatnonzero(~(np.isfinite(w) & (w >= 0)))[0])
        raise ValueError(f"`weights[{bad}]` must be finite and >= 0, got {w[bad]!r}.")
    return w


class LastIterateHeuristicAccountant(PrivacyAccountant):
    """A dp_accounting accountant whose epsilon and delta are the last-iterate heuristic of the
    composed DP-SGD steps (module docstring: events, neighbouring relations, weights).

    Args:
        neighboring_relation: ``NeighboringRelation.ADD_OR_REMOVE_ONE`` (default) or
            ``NeighboringRelation.REPLACE_SPECIAL``.
        weights: per-step weights of the noisy gradients in the final model (momentum,
            learning-rate schedules): a sequence with one non-negative weight per composed
            step, or a callable ``T -> T weights``; ``None`` for plain SGD at a constant
            learning rate.
        robust: the robust heuristic (the maximum over the last t <= T steps,
            ``privacy_model("robust_heuristic", run)``) instead of the heuristic; runs
            without weights only.

    Attributes:
        kind: ``"heuristic"``, what every number of this accountant is.

    Raises:
        TypeError: a parameter of the wrong type (named).
        ValueError: ``REPLACE_ONE``, a negative or non-finite weight, or ``robust`` with
            ``weights``.
    """

    kind = "heuristic"

    def __init__(
        self,
        neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE,
        *,
        weights: WeightsLike | None = None,
        robust: bool = False,
    ) -> None:
        if not isinstance(neighboring_relation, NeighboringRelation):
            raise TypeError(
                "`neighboring_relation` must be a dp_accounting NeighboringRelation, "
                f"got {neighboring_relation!r}."
            )
        if neighboring_relation not in _RELATIONS:
            raise ValueError(
                "`neighboring_relation` must be ADD_OR_REMOVE_ONE or REPLACE_SPECIAL (the "
                "heuristic's pair: the canary present or contributing nothing), got "
                f"{neighboring_relation}."
            )
        if not isinstance(robust, (bool, np.bool_)):
            raise TypeError(f"`robust` must be a bool, got {robust!r}.")
        checked: np.ndarray | Callable[[int], Any] | None = None
        if weights is not None:
            checked = weights if callable(weights) else _check_weights_array(weights)
        if robust and checked is not None:
            raise ValueError(
                "`robust` must be False when `weights` are given: the robust heuristic is "
                "computed for runs without per-step weights."
            )
        super().__init__(neighboring_relation)
        self._weights = checked
        self._robust = bool(robust)
        self._segments: list[tuple[float, float, int]] = []
        self._non_private = False
        self._model: PrivacyModel | None = None

    # -- the dp_accounting contract ---------------------------------------------------------

    def compose(self, event: dp_event.DpEvent, count: int = 1) -> LastIterateHeuristicAccountant:
        """Account for ``count`` applications of ``event`` (dp_accounting's ``compose``).

        Raises:
            TypeError / ValueError: ``count`` is not an integer >= 0.
            dp_accounting.UnsupportedEventError: the event is not DP-SGD steps this
                accountant reads (module docstring); nothing is composed.
        """
        n = check_int("count", count, minimum=0)
        super().compose(event, n)
        return self

    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> _Details | None:
        if isinstance(event, dp_event.NoOpDpEvent):
            return None
        if isinstance(event, dp_event.NonPrivateDpEvent):
            if do_compose:
                self._non_private = True
            return None
        if isinstance(event, dp_event.SelfComposedDpEvent):
            try:
                times = check_int("count", event.count, minimum=0)
            except (TypeError, ValueError) as bad:
                return _Details(event, str(bad))
            return self._maybe_compose(event.event, times * count, do_compose)
        if isinstance(event, dp_event.ComposedDpEvent):
            for sub in event.events:
                error = self._maybe_compose(sub, count, do_compose)
                if error is not None:
                    return error
            return None
        step = self._step(event)
        if isinstance(step, str):
            return _Details(event, step)
        if do_compose and count > 0:
            self._add(step[0], step[1], count)
        return None

    def get_epsilon(self, target_delta: float) -> float:
        """The heuristic epsilon of the final model at ``target_delta`` in (0, 1): 0 for no
        steps, inf after a ``NonPrivateDpEvent`` or a step without noise."""
        delta = check_delta(target_delta, "target_delta")
        if self._non_private:
            return math.inf
        return self._privacy_model().epsilon(delta)

    def get_delta(self, target_epsilon: float) -> float:
        """The heuristic delta of the final model at ``target_epsilon`` >= 0: 0 for no steps,
        1 after a ``NonPrivateDpEvent`` or a step without noise."""
        epsilon = check_epsilon(target_epsilon, "target_epsilon")
        if self._non_private:
            return 1.0
        return self._privacy_model().delta(epsilon)

    # -- what the numbers are ---------------------------------------------------------------

    @property
    def label(self) -> str:
        """One line saying what the numbers describe (the registry entry's description)."""
        return PRIVACY_MODELS["robust_heuristic" if self._robust else "heuristic"].description

    @property
    def run(self) -> DPSGDRun:
        """The :class:`~.run.DPSGDRun` of the steps composed so far, with the weights (for
        the registry's other models, e.g. ``privacy_model("standard", accountant.run)``).

        Raises:
            ValueError: the weights do not have one entry per composed step.
        """
        steps = sum(s for _, _, s in self._segments)
        weights: np.ndarray | None = None
        if self._weights is not None:
            if callable(self._weights):
                weights = _check_weights_array(self._weights(steps))
            else:
                weights = self._weights
            if weights.size != steps:
                raise ValueError(
                    f"`weights` must have one entry per composed step ({steps}), got "
                    f"{weights.size}."
                )
        return DPSGDRun.from_history(self._segments, weights=weights)

    # -- internals ---------------------------------------------------------------------------

    def _privacy_model(self) -> PrivacyModel:
        if self._model is None:
            if not self._segments:
                self._model = privacy_model("heuristic", DPSGDRun.from_history([]))
            else:
                name = "robust_heuristic" if self._robust else "heuristic"
                self._model = privacy_model(name, self.run)
        return self._model

    def _add(self, sigma: float, q: float, count: int) -> None:
        if self._segments and self._segments[-1][:2] == (sigma, q):
            self._segments[-1] = (sigma, q, self._segments[-1][2] + count)
        else:
            self._segments.append((sigma, q, count))
        self._model = None

    def _step(self, event: dp_event.DpEvent) -> tuple[float, float] | str:
        """(noise multiplier, per-step inclusion probability) of a one-step event, or why it
        is not one (the message of the unsupported-event error)."""
        try:
            if isinstance(event, dp_event.GaussianDpEvent):
                return _sigma(event.noise_multiplier), 1.0
            if isinstance(event, dp_event.PoissonSampledDpEvent):
                if not isinstance(event.event, dp_event.GaussianDpEvent):
                    return (
                        "a PoissonSampledDpEvent must sample a GaussianDpEvent (a DP-SGD "
                        f"step), found {event.event}."
                    )
                q = check_in_interval(
                    "sampling_probability", event.sampling_probability, 0.0, 1.0, high_open=False
                )
                return _sigma(event.event.noise_multiplier), q
            if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
                return self._without_replacement(event)
        except (TypeError, ValueError) as bad:
            return str(bad)
        return (
            "not a DP-SGD step of the last-iterate heuristic (supported: Poisson-sampled or "
            "full-batch Gaussian steps, and fixed-size batches under REPLACE_SPECIAL)."
        )

    def _without_replacement(
        self, event: dp_event.SampledWithoutReplacementDpEvent
    ) -> tuple[float, float] | str:
        if self.neighboring_relation is not NeighboringRelation.REPLACE_SPECIAL:
            return (
                "SampledWithoutReplacementDpEvent needs neighboring_relation REPLACE_SPECIAL "
                "(same dataset size, the canary replaced by a record contributing nothing); "
                f"found {self.neighboring_relation}."
            )
        if not isinstance(event.event, dp_event.GaussianDpEvent):
            return (
                "a SampledWithoutReplacementDpEvent must sample a GaussianDpEvent (a DP-SGD "
                f"step), found {event.event}."
            )
        n = check_int("source_dataset_size", event.source_dataset_size, minimum=1)
        b = check_int("sample_size", event.sample_size, minimum=1)
        if b > n:
            raise ValueError(f"`sample_size` must be <= source_dataset_size = {n}, got {b}.")
        return _sigma(event.event.noise_multiplier), b / n

    def __repr__(self) -> str:
        steps = sum(s for _, _, s in self._segments)
        return (
            f"LastIterateHeuristicAccountant(steps={steps}, segments={len(self._segments)}, "
            f"robust={self._robust})"
        )


def _sigma(value: object) -> float:
    return check_in_interval("noise_multiplier", value, 0.0, math.inf, low_open=False)
