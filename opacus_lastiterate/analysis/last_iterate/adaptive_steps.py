"""One recorded step of an adaptive optimiser, and the weights of a run of them.

An accountant that follows an adaptive optimiser (Adam, AdamW, NAdam, RAdam, Adamax,
RMSprop, Adagrad) records, per step, the optimiser's :class:`~.adaptive_weights.AdaptiveSettings`
together with the standard deviation of the noise on one coordinate of the gradient the
optimiser sees (sigma_t C / B for Opacus's averaged noisy gradient): the two things the
frozen-second-moment weights of :func:`~.adaptive_weights.adaptive_weights` are made of.
:class:`AdaptiveStep` is that record; :func:`adaptive_run_weights` turns a run-length list
of them into the weights w_t of the final model (``docs/adaptive_optimizers.md``), and
:func:`adaptive_run_caveats` gives the sentences of
:func:`~.adaptive_regime.adaptive_heuristic_caveats` for the run.

**Adam and AdamW as heavy-ball SGD.** With the second moment frozen, a step of Adam or
AdamW (no L2 weight decay, one beta1 for the run) is p_s = d_s p_{s-1} - c_s m_s with
m_s = beta1 m_{s-1} + (1 - beta1) g_s, c_s = lr_s / ((1 - beta1^s)(sqrt(v_s / (1 - beta2^s)) + eps))
and d_s = 1 - lr_s lambda (decoupled decay; 1 without). Unrolled, with P_s = d_1 ... d_s,

    w_t = (1 - beta1) P_T sum_{s >= t} (c_s / P_s) beta1^(s - t),

which is (1 - beta1) P_T times the weight of heavy-ball SGD (momentum beta1, no dampening)
at learning rates c_s / P_s. The weighted heuristic depends on the weights only up to a
common factor, so such a run has the epsilon of that SGD run; and c_s / P_s depends only on
steps up to s. :class:`SGDEquivalent` turns each step, as it is recorded, into those SGD
settings, which lets the kept SGD engine
(:class:`~.incremental_weighted.IncrementalWeightedHeuristic`) follow an Adam run step by
step instead of solving it from scratch at every query.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.last_iterate.adaptive_arrays import (
    linear_recursion,
    python_powers,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_regime import adaptive_heuristic_caveats
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    AdaptiveSettings,
    adaptive_weights,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings

__all__ = [
    "AdaptiveStep",
]

_SGD_EQUIVALENT = ("adam", "adamw")
_MAX_LOG_DECAY = 600.0  # 1 / P_s up to e^600: the rates stay finite floats

ADAPTIVE_STEP_FIELDS: tuple[str, ...] = (
    "optimizer", "lr", "beta1", "beta2", "eps", "weight_decay", "decoupled_weight_decay",
    "amsgrad", "centered", "lr_decay", "initial_accumulator_value", "momentum_decay",
    "noise_std",
)  # fmt: skip
"""The fields of :meth:`AdaptiveStep.as_tuple`, in order (the settings', then noise_std)."""


@dataclass(frozen=True)
class AdaptiveStep:
    """The settings of one step of an adaptive optimiser and the noise it saw.

    Attributes:
        settings: the optimiser's hyperparameters at this step.
        noise_std: s_t > 0, the standard deviation of the noise on one coordinate of the
            gradient the optimiser sees (sigma_t C / B under Opacus).
    """

    settings: AdaptiveSettings
    noise_std: float

    def __post_init__(self) -> None:
        if not isinstance(self.settings, AdaptiveSettings):
            raise TypeError(
                f"`settings` must be an AdaptiveSettings, got {type(self.settings).__name__}."
            )
        std = check_in_interval("noise_std", self.noise_std, 0.0, math.inf)
        object.__setattr__(self, "noise_std", std)

    @classmethod
    def from_tuple(cls, values: Sequence[object]) -> AdaptiveStep:
        """The step of :meth:`as_tuple`'s values (validated as the constructors do)."""
        *fields, noise_std = values
        return cls(AdaptiveSettings(*fields), noise_std)  # type: ignore[arg-type]

    def as_tuple(self) -> tuple[object, ...]:
        """The values of :data:`ADAPTIVE_STEP_FIELDS`, in order."""
        return (*self.settings.as_tuple(), self.noise_std)


def _per_step(runs: Sequence[tuple[AdaptiveStep, int]]) -> tuple[list[AdaptiveSettings], np.ndarray]:
    settings: list[AdaptiveSettings] = []
    for step, n in runs:
        settings.extend([step.settings] * int(n))
    noise = np.repeat([step.noise_std for step, _ in runs], [int(n) for _, n in runs])
    return settings, noise


def adaptive_run_weights(runs: Sequence[tuple[AdaptiveStep, int]]) -> np.ndarray:
    """The weights w_1..w_T of a run given as (step, number of steps) pairs, oldest first:
    :func:`~.adaptive_weights.adaptive_weights` of the per-step settings and noise."""
    settings, noise = _per_step(runs)
    return adaptive_weights(settings, noise_std=noise)


def adaptive_run_caveats(
    runs: Sequence[tuple[AdaptiveStep, int]],
    noise_multipliers: Sequence[float] | np.ndarray,
    sample_rates: Sequence[float] | np.ndarray,
) -> tuple[str, ...]:
    """The caveats (:func:`~.adaptive_regime.adaptive_heuristic_caveats`) of a recorded run:
    its largest sample rate, smallest noise multiplier (> 0), extreme betas and largest
    eps / noise_std. ``()`` for an empty run."""
    if not runs:
        return ()
    steps = [step for step, _ in runs]
    sigma = np.asarray(noise_multipliers, dtype=float)
    positive = sigma[sigma > 0]
    if positive.size == 0:
        return ()
    beta1 = [s.settings.beta1 for s in steps]
    beta2 = [s.settings.beta2 for s in steps]
    extreme_b1 = max(beta1) if max(beta1) > 0.9 else min(beta1)
    extreme_b2 = max(beta2) if max(beta2) > 0.999 else min(beta2)
    return adaptive_heuristic_caveats(
        steps[0].settings.optimizer,
        sample_rate=float(np.max(sample_rates)),
        noise_multiplier=float(positive.min()),
        steps=int(sum(n for _, n in runs)),
        beta1=extreme_b1,
        beta2=extreme_b2,
        eps_over_noise=max(s.settings.eps / s.noise_std for s in steps),
    )


class SGDEquivalent:
    """Follows a run of :class:`AdaptiveStep` records and gives, for each step, the SGD
    settings whose heavy-ball weights are proportional to the adaptive weights (module
    docstring): Adam and AdamW without L2 weight decay, at one beta1. From the first step
    that does not fit (another optimizer, L2 decay, a new beta1, a decay factor <= 0 or one
    that would overflow the rates) :attr:`supported` is False for good and :meth:`append`
    returns None."""

    def __init__(self) -> None:
        self.supported = True
        self._t = 0
        self._v = 0.0  # expected second moment (exp_avg_sq)
        self._v_max = 0.0  # its running maximum (amsgrad)
        self._log_decay = 0.0  # log P_s
        self._beta1: float | None = None

    def append(self, step: AdaptiveStep) -> SGDSettings | None:
        """The SGD settings of the next step, or None where the run does not map."""
        st = step.settings
        if not self.supported or not self._fits(st):
            self.supported = False
            return None
        self._beta1 = st.beta1
        t = self._t = self._t + 1
        self._v = st.beta2 * self._v + (1.0 - st.beta2) * step.noise_std**2
        self._v_max = max(self._v_max, self._v)
        state = self._v_max if st.amsgrad else self._v
        bc1, bc2 = 1.0 - st.beta1**t, 1.0 - st.beta2**t
        rate = st.lr / (bc1 * (math.sqrt(state) / math.sqrt(bc2) + st.eps))
        if st.weight_decay:
            decay = 1.0 - st.lr * st.weight_decay
            if decay <= 0.0:
                self.supported = False
                return None
            self._log_decay += math.log(decay)
        if -self._log_decay > _MAX_LOG_DECAY:
            self.supported = False
            return None
        return SGDSettings(rate * math.exp(-self._log_decay), st.beta1, 0.0, False, 0.0)

    def extend(self, columns: Any) -> np.ndarray | None:
        """The SGD learning rates of the steps of ``columns`` (an
        :class:`~.adaptive_columns.AdaptiveColumns`, trusted), one per step, computed in
        numpy with the same floats as :meth:`append` of each step gives (the recursions in
        the same order, the powers, logarithms and exponentials by Python's own functions);
        the momentum of every step is the run's beta1 (:attr:`beta1`). None, and
        :attr:`supported` False for good, where a step does not fit (class docstring)."""
        steps = np.asarray(columns.steps)
        keep = steps > 0
        lr, beta1, beta2, eps, wd, noise = (
            np.asarray(c)[keep] for c in (columns.lr, columns.beta1, columns.beta2,
                                          columns.eps, columns.weight_decay, columns.noise_std)
        )  # fmt: skip
        counts = steps[keep]
        decoupled = np.asarray(columns.decoupled_weight_decay)[keep]
        amsgrad = np.asarray(columns.amsgrad)[keep]
        n = int(counts.sum())
        if not self.supported:
            return None
        if not n:
            return np.zeros(0)
        first = float(beta1[0]) if self._beta1 is None else self._beta1
        decay = 1.0 - lr * wd
        if (
            not set(np.asarray(columns.optimizer)[keep].tolist()) <= set(_SGD_EQUIVALENT)
            or ((wd != 0.0) & ~decoupled).any()
            or (beta1 != first).any()
            or ((wd != 0.0) & (decay <= 0.0)).any()
        ):
            self.supported = False
            return None
        logs = np.zeros(len(counts))
        logs[wd != 0.0] = list(map(math.log, decay[wd != 0.0].tolist()))
        log_decay = np.cumsum(np.concatenate(([self._log_decay], np.repeat(logs, counts))))[1:]
        if (-log_decay > _MAX_LOG_DECAY).any():
            self.supported = False
            return None
        # v_t = beta2 v_{t-1} + (1 - beta2) s_t^2, as the loop of append computes it
        b2 = np.repeat(beta2, counts)
        x = (1.0 - beta2) * python_powers(noise, [2] * len(noise))
        v = linear_recursion(b2, np.repeat(x, counts), self._v)
        v_max = np.maximum.accumulate(np.concatenate(([self._v_max], v)))[1:]
        state = np.where(np.repeat(amsgrad, counts), v_max, v)
        t = range(self._t + 1, self._t + n + 1)
        bc1 = 1.0 - python_powers(np.full(n, first), t)
        bc2 = 1.0 - python_powers(b2, t)
        rate = np.repeat(lr, counts) / (
            bc1 * (np.sqrt(state) / np.sqrt(bc2) + np.repeat(eps, counts))
        )
        if (log_decay != 0.0).any():
            rate = rate * np.array(list(map(math.exp, (-log_decay).tolist())))
        self._t += n
        self._v, self._v_max = float(v[-1]), float(v_max[-1])
        self._log_decay, self._beta1 = float(log_decay[-1]), first
        return rate

    @property
    def beta1(self) -> float | None:
        """The run's beta1, the momentum of its SGD equivalent (None before a step)."""
        return self._beta1

    def _fits(self, st: AdaptiveSettings) -> bool:
        return (
            st.optimizer in _SGD_EQUIVALENT
            and (not st.weight_decay or st.decoupled_weight_decay)
            and (self._beta1 is None or st.beta1 == self._beta1)
        )
