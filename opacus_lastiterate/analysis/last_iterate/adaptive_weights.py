"""Per-step weights of the noisy gradients in the final model of torch's adaptive optimisers.

The model (``docs/adaptive_optimizers.md``): with a linear loss, and with each optimiser's
second-moment state replaced by its *expected* value under the DP noise alone (a
deterministic sequence), every step of Adam, AdamW, NAdam, RAdam, Adamax, RMSprop and
Adagrad is linear in the noisy gradient g_t, so the final model is

    m_T = A m_0 - sum_t w_t g_t,

and the weighted heuristic of
:mod:`opacus_lastiterate.analysis.last_iterate.weighted_heuristic` applies to these w_t
(``privacy_model("heuristic", DPSGDRun(..., weights=w))``). The result is labelled
"heuristic; adaptive second moment treated as fixed": an approximation on top of a heuristic.

Every optimiser here is one linear recursion per step on (parameter p, first moment m)::

    g~_t = g_t + lambda_t p_{t-1}                 (L2 weight decay folded into the gradient)
    m_t  = beta_t m_{t-1} + k_t g~_t              (m_0 = 0)
    p_t  = d_t p_{t-1} - a_t g~_t - c_t m_t       (d_t = 1 - lr_t lambda'_t, decoupled decay)

with step coefficients read off torch's code (``D_t`` the frozen denominator, ``bc1`` and
``bc2`` the bias corrections 1 - beta1^t and 1 - beta2^t):

* Adam / AdamW: beta = beta1, k = 1 - beta1, a = 0, c = lr / (bc1 (sqrt(v_t / bc2) + eps)),
  with v_t replaced by its running maximum for ``amsgrad``;
* NAdam: as Adam with a = lr (1 - mu_t) / ((1 - prod mu) D_t),
  c = lr mu_{t+1} / ((1 - prod mu mu_{t+1}) D_t), D_t = sqrt(v_t / bc2) + eps;
* RAdam: c = lr r_t sqrt(bc2) / (bc1 (sqrt(v_t) + eps)) once rho_t > 5, else c = lr / bc1
  (the unrectified early steps are not divided by anything);
* Adamax: c = lr / (bc1 u_t), u_t the infinity-norm state (eps inside the maximum);
* RMSprop (beta1 is torch's ``momentum``, beta2 its ``alpha``): with momentum, beta = momentum,
  k = 1 / D_t, c = lr; without, a = lr / D_t; D_t = sqrt(v_t - centred term) + eps;
* Adagrad: a = lr / ((1 + (t - 1) lr_decay)(sqrt(S_t) + eps)).

The weights are w_t = -d p_T / d g_t, found by running the recursion backwards (exact for
the model). The frozen state (:func:`expected_second_moment`) is the expectation of the
optimiser's own state when each gradient coordinate is N(0, s_t^2), s_t the ``noise_std``
argument: sigma_t C / B for the noise of Opacus's averaged gradient (noise multiplier
sigma_t, clipping norm C, expected batch size B). Because the weights are only used up to a
common factor, s_t matters only through its changes over time and through eps; the caller
must still give it, as Adam's eps against s_t, RMSprop's and Adagrad's growing states and
RAdam's unrectified steps make the weights depend on it. ``maximize=True`` is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_real
from opacus_lastiterate.analysis.last_iterate.adaptive_arrays import (
    StepArrays,
    backward_weights,
    expected_state,
    step_coefficients,
)
from opacus_lastiterate.exceptions import UnsupportedOptimizerError

__all__ = [
    "AdaptiveSettings",
    "adaptive_weights",
    "settings_from_param_group",
]

#: The optimisers whose weights this module gives (lower-case torch class names).
ADAPTIVE_WEIGHT_OPTIMIZERS: tuple[str, ...] = (
    "adam",
    "adamw",
    "nadam",
    "radam",
    "adamax",
    "rmsprop",
    "adagrad",
)
#: The label of a heuristic epsilon computed from these weights.
ADAPTIVE_HEURISTIC_LABEL = "heuristic; adaptive second moment treated as fixed"
_DECOUPLED_CAPABLE = ("adam", "adamw", "nadam", "radam")

# torch's own defaults, used by :func:`settings_from_param_group` for missing keys.
_DEFAULT_EPS = {"adagrad": 1e-10}


def canonical_adaptive_name(optimizer: object) -> str:
    """The lower-case name of a supported adaptive optimiser.

    ``optimizer`` may be a name (``"AdamW"``, ``"adamw"``), a class or an instance (an Opacus
    ``DPOptimizer`` is judged by the ``original_optimizer`` it wraps); only the class name
    is read, so torch is not imported.

    Raises:
        UnsupportedOptimizerError: (a ``ValueError``) for any other optimiser, naming it and
            what to do instead.
    """
    if isinstance(optimizer, str):
        name = optimizer
    else:
        inner = getattr(optimizer, "original_optimizer", None)
        obj = optimizer if inner is None else inner
        name = (obj if isinstance(obj, type) else type(obj)).__name__
    key = name.lower().replace("_", "").replace("-", "")
    if key.startswith("dp") and key[2:] in ADAPTIVE_WEIGHT_OPTIMIZERS:
        key = key[2:]
    if key in ADAPTIVE_WEIGHT_OPTIMIZERS:
        return key
    raise UnsupportedOptimizerError(
        f"`optimizer` {name!r} has no adaptive weights: supported are "
        f"{', '.join(ADAPTIVE_WEIGHT_OPTIMIZERS)} (torch.optim semantics) and SGD "
        "(optimizer_weights.sgd_weights). Train with one of them, or report the standard "
        "epsilon (privacy_model('standard', run)), which holds for any optimizer."
    )


@dataclass(frozen=True)
class AdaptiveSettings:
    """The hyperparameters of one parameter group of an adaptive torch optimiser at one step.

    One instance per step (an accountant's hook records one per step); the weights of a run
    come from the sequence of them (:func:`adaptive_weights`). Fields follow torch's names
    with two shared slots: ``beta1`` is Adam's ``betas[0]`` and RMSprop's ``momentum``,
    ``beta2`` is Adam's ``betas[1]`` and RMSprop's ``alpha`` (Adagrad uses neither).

    Attributes:
        optimizer: one of :data:`ADAPTIVE_WEIGHT_OPTIMIZERS` (any case; stored lower-case).
        lr: the learning rate of this step (>= 0).
        beta1: first-moment decay in [0, 1) (RMSprop's momentum, >= 0).
        beta2: second-moment decay in [0, 1) (RMSprop's alpha in [0, 1)).
        eps: the optimiser's eps (>= 0).
        weight_decay: lambda >= 0; decoupled (p <- (1 - lr lambda) p) when
            ``decoupled_weight_decay``, else added to the gradient as lambda p.
        decoupled_weight_decay: AdamW's decay (forced True for ``"adamw"``); only Adam,
            AdamW, NAdam and RAdam have it.
        amsgrad: Adam/AdamW's running maximum of the second moment.
        centered: RMSprop's centred variant.
        lr_decay: Adagrad's learning-rate decay (>= 0).
        initial_accumulator_value: Adagrad's initial state (>= 0; read at the first step).
        momentum_decay: NAdam's psi (>= 0).
    """

    optimizer: str
    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = False
    amsgrad: bool = False
    centered: bool = False
    lr_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    momentum_decay: float = 0.004

    def __post_init__(self) -> None:
        if not isinstance(self.optimizer, str):
            raise TypeError(f"`optimizer` must be a string, got {self.optimizer!r}.")
        name = canonical_adaptive_name(self.optimizer)
        lr = check_in_interval("lr", self.lr, 0.0, math.inf, low_open=False)
        high_beta1 = math.inf if name == "rmsprop" else 1.0
        b1 = check_in_interval("beta1", self.beta1, 0.0, high_beta1, low_open=False)
        b2 = check_in_interval("beta2", self.beta2, 0.0, 1.0, low_open=False)
        eps = check_in_interval("eps", self.eps, 0.0, math.inf, low_open=False)
        wd = check_in_interval("weight_decay", self.weight_decay, 0.0, math.inf, low_open=False)
        lr_decay = check_in_interval("lr_decay", self.lr_decay, 0.0, math.inf, low_open=False)
        init = check_in_interval(
            "initial_accumulator_value", self.initial_accumulator_value, 0.0, math.inf,
            low_open=False,
        )
        psi = check_in_interval(
            "momentum_decay", self.momentum_decay, 0.0, math.inf, low_open=False
        )
        for flag in ("decoupled_weight_decay", "amsgrad", "centered"):
            if not isinstance(getattr(self, flag), (bool, np.bool_)):
                raise TypeError(f"`{flag}` must be a bool, got {getattr(self, flag)!r}.")
        decoupled = bool(self.decoupled_weight_decay) or name == "adamw"
        if decoupled and name not in _DECOUPLED_CAPABLE:
            raise ValueError(
                f"`decoupled_weight_decay` is not an option of {name} (only of "
                f"{', '.join(_DECOUPLED_CAPABLE)})."
            )
        if self.amsgrad and name not in ("adam", "adamw"):
            raise ValueError(f"`amsgrad` is an option of adam and adamw only, not of {name}.")
        if self.centered and name != "rmsprop":
            raise ValueError(f"`centered` is an option of rmsprop only, not of {name}.")
        values = (lr, b1, b2, eps, wd, lr_decay, init, psi)
        fields = ("lr", "beta1", "beta2", "eps", "weight_decay", "lr_decay",
                  "initial_accumulator_value", "momentum_decay")
        for field_name, value in zip(fields, values, strict=True):
            object.__setattr__(self, field_name, value)
        object.__setattr__(self, "optimizer", name)
        object.__setattr__(self, "decoupled_weight_decay", decoupled)
        object.__setattr__(self, "amsgrad", bool(self.amsgrad))
        object.__setattr__(self, "centered", bool(self.centered))

    def as_tuple(self) -> tuple[object, ...]:
        """The fields in declaration order (for records and checkpoints)."""
        return (
            self.optimizer, self.lr, self.beta1, self.beta2, self.eps, self.weight_decay,
            self.decoupled_weight_decay, self.amsgrad, self.centered, self.lr_decay,
            self.initial_accumulator_value, self.momentum_decay,
        )


def settings_from_param_group(optimizer: object, group: Mapping[str, object]) -> AdaptiveSettings:
    """The :class:`AdaptiveSettings` of one torch parameter group (``optimizer.param_groups[i]``).

    ``optimizer`` names the class (a name, class or instance, see
    :func:`canonical_adaptive_name`); ``group`` is the group's dict. Keys torch uses only for
    speed or autograd (``foreach``, ``fused``, ``capturable``, ``differentiable``) are
    ignored: they compute the same update. A tensor ``lr`` is read with ``float``.

    Raises:
        ValueError: ``maximize`` is true (the update ascends the loss; the model here does not
            describe it), or a value is out of range (named).
        UnsupportedOptimizerError: the optimiser is not supported.
    """
    name = canonical_adaptive_name(optimizer)
    if not isinstance(group, Mapping):
        raise TypeError(f"`group` must be a mapping (a param group), got {type(group).__name__}.")
    if group.get("maximize", False):
        raise ValueError(
            "`maximize`=True is not supported: the adaptive weights describe a descent on "
            "the loss. Train with maximize=False (negate the loss instead)."
        )

    def num(key: str, default: float) -> float:
        value = group.get(key, default)
        if hasattr(value, "item") and not isinstance(value, (int, float)):
            value = value.item()  # type: ignore[union-attr]  # 1-element tensor or numpy scalar
        return check_real(key, value)

    if name == "rmsprop":
        beta1, beta2 = num("momentum", 0.0), num("alpha", 0.99)
    elif name == "adagrad":
        beta1, beta2 = 0.0, 0.0
    else:
        betas = group.get("betas", (0.9, 0.999))
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"`betas` must be a pair of numbers, got {betas!r}.")
        beta1, beta2 = (check_real(f"betas[{i}]", float(b)) for i, b in enumerate(betas))
    return AdaptiveSettings(
        optimizer=name,
        lr=num("lr", 1e-3),
        beta1=beta1,
        beta2=beta2,
        eps=num("eps", _DEFAULT_EPS.get(name, 1e-8)),
        weight_decay=num("weight_decay", 0.0),
        decoupled_weight_decay=bool(group.get("decoupled_weight_decay", name == "adamw")),
        amsgrad=bool(group.get("amsgrad", False)),
        centered=bool(group.get("centered", False)),
        lr_decay=num("lr_decay", 0.0),
        initial_accumulator_value=num("initial_accumulator_value", 0.0),
        momentum_decay=num("momentum_decay", 0.004),
    )


def _check_settings(settings: object) -> list[AdaptiveSettings]:
    if isinstance(settings, AdaptiveSettings):
        raise TypeError("`settings` must be a sequence of AdaptiveSettings (one per step).")
    if not isinstance(settings, Sequence):
        raise TypeError(
            f"`settings` must be a sequence of AdaptiveSettings, got {type(settings).__name__}."
        )
    out = list(settings)
    for i, s in enumerate(out):
        if not isinstance(s, AdaptiveSettings):
            raise TypeError(f"`settings[{i}]` must be an AdaptiveSettings, got {s!r}.")
    if out:
        first = out[0]
        for i, s in enumerate(out):
            for flag in ("optimizer", "decoupled_weight_decay", "amsgrad", "centered"):
                if getattr(s, flag) != getattr(first, flag):
                    raise ValueError(
                        f"`settings[{i}].{flag}` is {getattr(s, flag)!r} but "
                        f"`settings[0].{flag}` is {getattr(first, flag)!r}: one run uses one "
                        "optimizer with the same options throughout."
                    )
    return out


def _per_step_positive(name: str, value: object, n: int) -> np.ndarray:
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        arr = list(np.asarray(value, dtype=object).ravel()) if np.ndim(value) == 1 else None
        if arr is None or len(arr) != n:
            raise ValueError(f"`{name}` must be a scalar or have one entry per step ({n}).")
        return np.array(
            [check_in_interval(f"{name}[{i}]", v, 0.0, math.inf) for i, v in enumerate(arr)]
        )
    return np.full(n, check_in_interval(name, value, 0.0, math.inf))


def expected_second_moment(
    settings: Sequence[AdaptiveSettings], *, noise_std: float | Sequence[float] | np.ndarray
) -> np.ndarray:
    """The frozen second-moment state of each step: its expectation when the gradient
    coordinate of step t is N(0, s_t^2), s_t = ``noise_std`` (scalar or one per step, > 0).

    What the state is, per optimiser (before eps and bias correction, as torch stores it):

    * Adam, AdamW, NAdam, RAdam: ``exp_avg_sq``, v_t = beta2 v_{t-1} + (1 - beta2) s_t^2;
    * RMSprop: ``square_avg`` (same recursion with alpha); centred: minus E[grad_avg^2],
      which obeys b_t = alpha^2 b_{t-1} + (1 - alpha)^2 s_t^2;
    * Adagrad: ``state_sum``, S_t = initial_accumulator_value + sum_{k <= t} s_k^2;
    * Adamax: ``exp_inf``, u_t = max(beta2 u_{t-1}, ``|g_t|`` + eps), whose expectation is
      integrated numerically from its distribution function
      P(u_t <= x) = P(u_{t-1} <= x / beta2) P(``|g_t|`` <= x - eps) on a grid of 4096 points
      up to 10 max_t s_t + eps (linear interpolation: relative accuracy about 1e-5).

    Returns:
        A float array, one state per step (``amsgrad``'s maximum is applied later, in
        :func:`weights_given_second_moment`, as in torch).
    """
    steps = _check_settings(settings)
    noise = _per_step_positive("noise_std", noise_std, len(steps))
    if not steps:
        return np.zeros(0)
    first = steps[0]
    return expected_state(first.optimizer, first.centered, step_arrays(steps), noise)


def step_arrays(steps: Sequence[AdaptiveSettings]) -> StepArrays:
    """The settings of each step that may change during a run, one array per field
    (:class:`~.adaptive_arrays.StepArrays`)."""
    return StepArrays._make(
        np.array([getattr(st, f) for st in steps], dtype=float) for f in StepArrays._fields
    )


def weights_given_second_moment(
    settings: Sequence[AdaptiveSettings], second_moment: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Weights w_1..w_T (m_T = A m_0 - sum_t w_t g_t) with the second-moment state of each
    step fixed at ``second_moment[t]`` (the state as torch stores it, see
    :func:`expected_second_moment`; > 0 where the optimiser divides by it without eps).

    Exact for the linear recursion of the module docstring; computed backwards in O(T).
    Weights may be negative only where L2 weight decay with lr lambda / D_t > 1 flips a sign.
    """
    steps = _check_settings(settings)
    n = len(steps)
    try:
        state = np.asarray(second_moment, dtype=float)
    except (TypeError, ValueError):
        raise TypeError("`second_moment` must be a sequence of real numbers.") from None
    if state.ndim != 1 or state.size != n:
        raise ValueError(f"`second_moment` must have one entry per step ({n}), got {state.shape}.")
    bad = np.flatnonzero(~(np.isfinite(state) & (state >= 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"`second_moment[{i}]` must be finite and >= 0, got {state[i]!r}.")
    if n == 0:
        return np.zeros(0)
    first = steps[0]
    coef = step_coefficients(
        first.optimizer, first.decoupled_weight_decay, first.amsgrad, step_arrays(steps), state
    )
    return backward_weights(*coef)


def adaptive_weights(
    settings: Sequence[AdaptiveSettings], *, noise_std: float | Sequence[float] | np.ndarray
) -> np.ndarray:
    """The final-model weights of each step's noisy gradient under the frozen-second-moment
    model (module docstring): :func:`weights_given_second_moment` at
    :func:`expected_second_moment`.

    Args:
        settings: one :class:`AdaptiveSettings` per step (same optimiser and options
            throughout; rates, betas, eps and weight decay may change per step).
        noise_std: s_t > 0, the standard deviation of the noise on one coordinate of the
            gradient the optimiser sees, scalar or per step: sigma_t C / B for Opacus's
            averaged noisy gradient. Only its changes over time and its size against eps
            (and, for RAdam, against 1 at the unrectified steps) change the weights.

    Returns:
        A float array of length T, for ``DPSGDRun(..., weights=...)``; its heuristic is
        labelled "heuristic; adaptive second moment treated as fixed".
    """
    state = expected_second_moment(settings, noise_std=noise_std)
    return weights_given_second_moment(settings, state)
