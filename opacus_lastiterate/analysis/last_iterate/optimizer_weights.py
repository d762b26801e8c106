"""Per-step weights with which SGD's noisy gradients enter the final model.

With a linear loss every optimiser step of plain or heavy-ball SGD is linear in the noisy
gradients g_1, ..., g_T, so the final model is

    m_T = A m_0 - sum_t w_t g_t

for weights w_t that depend only on the learning rates and the optimiser's hyperparameters
(``docs/last_iterate.md``, "Per-step weights: schedules and momentum"). The canary then
enters the final model as
sum_t w_t Bernoulli(q_t) and the noise as N(0, sum_t w_t^2 sigma_t^2), which is the pair of
:mod:`opacus_lastiterate.analysis.last_iterate.weighted_heuristic`.

``torch.optim.SGD`` semantics (step t = 1..T, learning rate eta_t, momentum beta,
dampening d, weight decay lambda)::

    g~_t = g_t + lambda m_{t-1}
    b_t  = g~_t                              if t == 1
    b_t  = beta b_{t-1} + (1 - d) g~_t       otherwise          (only when beta != 0)
    u_t  = g~_t + beta b_t  (nesterov)   or   b_t   (heavy ball)   or   g~_t  (beta == 0)
    m_t  = m_{t-1} - eta_t u_t

Without weight decay, with R_t = sum_{s>=t} eta_s beta^(s-t) and a_1 = 1, a_t = 1 - d (t > 1):

    heavy ball:  w_t = a_t R_t          nesterov:  w_t = eta_t + beta a_t R_t,

so at constant eta and d = 0, w_t = eta (1 - beta^(T-t+1)) / (1 - beta) as in the reference.
Momentum, dampening and weight decay may also vary per step (``OneCycleLR`` cycles the
momentum); the buffer is created at the first step with beta_t != 0 and left untouched at
steps with beta_t == 0, as in torch. Weight decay makes the model the "linear loss +
quadratic regulariser" example of ``docs/last_iterate.md``, "Known counterexamples". In these
general cases the weights come from running the linear recursion backwards (the adjoint);
they are exact for the linear model.

Adaptive optimisers (Adam, AdamW, Adagrad, RMSprop, ...) divide by a data-dependent
statistic, so their final model is not a fixed linear function of the noisy gradients and
the weights here do not describe them: :func:`check_optimizer_supported` raises for them.
Their weights, under the approximation that freezes that statistic at its expectation under
the noise, are in :mod:`.adaptive_weights` (``docs/adaptive_optimizers.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import signal

from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_int,
    check_positive,
    check_real,
)
from opacus_lastiterate.exceptions import UnsupportedOptimizerError

__all__ = [
    "SGDSettings",
    "builtin_schedule",
    "sgd_weights",
]


@dataclass(frozen=True)
class SGDSettings:
    """The hyperparameters of one ``torch.optim.SGD`` parameter group that fix the weights
    (what an accountant's hook records per step; read from an optimizer by
    :func:`opacus_lastiterate.schedules.sgd_settings`)."""

    lr: float
    momentum: float
    dampening: float
    nesterov: bool
    weight_decay: float

    def as_tuple(self) -> tuple[float, float, float, bool, float]:
        """(lr, momentum, dampening, nesterov, weight_decay) (``dataclasses.astuple`` deep-copies
        each field: 10 times slower, on every recorded step)."""
        return (self.lr, self.momentum, self.dampening, self.nesterov, self.weight_decay)

    def weights(self, learning_rates: Sequence[float] | np.ndarray) -> np.ndarray:
        """:func:`sgd_weights` for these settings at the given learning rates."""
        return sgd_weights(
            learning_rates,
            momentum=self.momentum,
            dampening=self.dampening,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
        )

SUPPORTED_OPTIMIZERS: tuple[str, ...] = ("sgd",)
ADAPTIVE_OPTIMIZERS: tuple[str, ...] = (
    "adam",
    "adamw",
    "adagrad",
    "adadelta",
    "adamax",
    "nadam",
    "radam",
    "rmsprop",
    "rprop",
    "sparseadam",
    "lbfgs",
    "adafactor",
    "lamb",
    "lion",
)


def _optimizer_name(optimizer: object) -> str:
    """Name of an optimiser given as a string, a class or an instance (DPOptimizer unwrapped)."""
    if isinstance(optimizer, str):
        return optimizer
    inner = getattr(optimizer, "original_optimizer", None)  # Opacus DPOptimizer wraps one
    if inner is not None:
        optimizer = inner
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    return cls.__name__


def check_optimizer_supported(optimizer: object) -> str:
    """Return the lower-case optimiser name if the weighted heuristic applies to it.

    ``optimizer`` may be a name (``"SGD"``, ``"adamw"``), a class or an instance; an Opacus
    ``DPOptimizer`` is judged by the optimiser it wraps (``DPSGD`` style names ending in
    ``sgd`` count as SGD). Raises :class:`UnsupportedOptimizerError` for adaptive optimisers
    and for names it does not know.
    """
    name = _optimizer_name(optimizer)
    key = name.lower().replace("_", "").replace("-", "")
    if key.startswith("dp") and key not in ADAPTIVE_OPTIMIZERS:
        key = key[2:]
    if key in SUPPORTED_OPTIMIZERS:
        return key
    if key in ADAPTIVE_OPTIMIZERS:
        raise UnsupportedOptimizerError(
            f"`optimizer` {name!r} is adaptive: it rescales each step by a data-dependent "
            "statistic, so the final model is not a fixed weighted sum of the noisy gradients "
            "and SGD's weights do not apply. Its weights with the second moment frozen "
            "are in analysis.last_iterate.adaptive_weights (docs/adaptive_optimizers.md)."
        )
    raise UnsupportedOptimizerError(
        f"`optimizer` {name!r} is not known to be linear in the noisy gradient; only SGD "
        "(torch.optim.SGD semantics) is supported by the weighted heuristic."
    )


def _check_rates(
    learning_rates: Sequence[float] | np.ndarray, name: str = "learning_rates"
) -> np.ndarray:
    if isinstance(learning_rates, (str, bytes)):
        raise TypeError(f"`{name}` must be a sequence of real numbers, got {learning_rates!r}.")
    try:
        arr = np.asarray(learning_rates)
    except (TypeError, ValueError):
        raise TypeError(
            f"`{name}` must be a sequence of real numbers, got {learning_rates!r}."
        ) from None
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be a one-dimensional sequence, got shape {arr.shape}.")
    if arr.dtype.kind not in "iuf":
        for i, v in enumerate(learning_rates):  # type: ignore[arg-type]
            check_real(f"{name}[{i}]", v)
        raise TypeError(f"`{name}` must hold real numbers, got dtype {arr.dtype}.")
    arr = arr.astype(float)
    bad = np.flatnonzero(~(np.isfinite(arr) & (arr >= 0)))
    if bad.size:
        i = int(bad[0])
        check_in_interval(f"{name}[{i}]", float(arr[i]), 0.0, math.inf, low_open=False)
    return arr


def _per_step(name: str, value: object, n: int, high: float, high_open: bool) -> np.ndarray:
    """A scalar or one value per step in [0, high] (or [0, high)); returned per step."""
    if isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes)):
        arr = np.asarray(value)
        if arr.ndim != 1 or arr.size != n:
            raise ValueError(
                f"`{name}` must be a scalar or have one entry per step ({n}), got {arr.size}."
            )
        return np.array(
            [
                check_in_interval(f"{name}[{i}]", v, 0.0, high, low_open=False, high_open=high_open)
                for i, v in enumerate(arr.tolist())
            ],
            dtype=float,
        )
    x = check_in_interval(name, value, 0.0, high, low_open=False, high_open=high_open)
    return np.full(n, x)


@dataclass(frozen=True)
class HeavyBallRecursion:
    """The weights of an SGD run with one momentum ``beta`` in [0, 1), ``dampening`` d and
    ``nesterov`` flag for every step and no weight decay, from its discounted rates
    R_t(T) = sum_{s=t..T} eta_s beta^(s-t): w_t(T) = a_t R_t(T) (heavy ball) or
    eta_t + beta a_t R_t(T) (nesterov), a_1 = 1 and a_t = 1 - d (module docstring). The
    incremental engines keep R_t(T) step by step and use these to turn it into weights."""

    beta: float
    dampening: float = 0.0
    nesterov: bool = False

    def discounted_rates(self, eta: np.ndarray) -> np.ndarray:
        """R_t = sum_{s>=t} eta_s beta^(s-t) for every t of ``eta`` (one backward filter)."""
        eta = np.asarray(eta, dtype=float)
        if self.beta > 0.0:
            return signal.lfilter([1.0], [1.0, -self.beta], eta[::-1])[::-1]
        return eta.copy()

    def damping(self, first: int, n: int) -> np.ndarray:
        """a_t of the steps first..first+n-1 (0-based: a_0 = 1)."""
        a = np.full(n, 1.0 - self.dampening)
        if first == 0 and n:
            a[0] = 1.0
        return a

    def weights(self, first: int, r: np.ndarray, eta: np.ndarray) -> np.ndarray:
        """w_t(T) of the steps first..first+len(r)-1 from their R_t(T) and rates."""
        a = self.damping(first, r.size)
        if self.nesterov:
            return eta + self.beta * a * r
        return a * r

    def growth(self, first: int, n: int, steps: int) -> np.ndarray:
        """c_t = a_t beta^(steps - t) (x beta for nesterov) of the steps first..first+n-1
        after ``steps`` steps: w_t(T') = w_t(T) + c_t R_{T+1}(T')."""
        t = np.arange(first, first + n, dtype=float)
        return (self.beta if self.nesterov else 1.0) * self.damping(first, n) * self.beta ** (steps - t)


def sgd_weights(
    learning_rates: Sequence[float] | np.ndarray,
    *,
    momentum: float | Sequence[float] | np.ndarray = 0.0,
    dampening: float | Sequence[float] | np.ndarray = 0.0,
    nesterov: bool = False,
    weight_decay: float | Sequence[float] | np.ndarray = 0.0,
) -> np.ndarray:
    """Weights w_1..w_T of the noisy gradients in the final model of ``torch.optim.SGD``.

    Args:
        learning_rates: eta_1..eta_T, the rate used at each step (>= 0).
        momentum: beta in [0, 1], one for all steps or one per step (``OneCycleLR`` cycles
            it); at a step with beta == 0 the buffer is neither used nor updated and
            dampening is ignored, as in torch. The buffer starts as the first gradient of
            the first step with beta != 0.
        dampening: d in [0, 1], scalar or per step.
        nesterov: Nesterov momentum (requires momentum > 0 and dampening == 0, as in torch).
        weight_decay: lambda >= 0 (L2 term added to the gradient, as in torch), scalar or
            per step.

    Returns:
        A float array of length T: m_T = A m_0 - sum_t w_t g_t (module docstring). The
        weights are non-negative unless weight decay with eta_t lambda > 1 flips a sign.
    """
    lr = _check_rates(learning_rates)
    n = lr.size
    beta = _per_step("momentum", momentum, n, 1.0, False)
    d = _per_step("dampening", dampening, n, 1.0, False)
    wd = _per_step("weight_decay", weight_decay, n, math.inf, True)
    if not isinstance(nesterov, (bool, np.bool_)):
        raise TypeError(f"`nesterov` must be a bool, got {nesterov!r}.")
    if nesterov and (np.any(beta <= 0.0) or np.any(d != 0.0)):
        raise ValueError(
            "`nesterov` requires momentum > 0 and dampening == 0 (as torch.optim.SGD), "
            f"got momentum={momentum!r}, dampening={dampening!r}."
        )
    if n == 0:
        return lr
    if np.any(wd > 0.0) or np.any(beta != beta[0]) or np.any(d != d[0]):
        return _adjoint_weights(lr, beta, d, bool(nesterov), wd)
    b, damp = float(beta[0]), float(d[0])
    if b == 0.0:
        return lr.copy()
    # R_t = eta_t + beta R_{t+1}: a first-order recursion run backwards in time.
    rec = HeavyBallRecursion(b, damp, bool(nesterov))
    return rec.weights(0, rec.discounted_rates(lr), lr)


def _adjoint_weights(
    lr: np.ndarray, beta: np.ndarray, d: np.ndarray, nesterov: bool, wd: np.ndarray
) -> np.ndarray:
    """w_t = -d m_T / d g_t by back-propagating through the linear SGD recursion (per-step
    momentum beta_t, dampening d_t and weight decay lambda_t)."""
    n = lr.size
    active = np.flatnonzero(beta != 0.0)
    first = int(active[0]) if active.size else n  # step that creates the momentum buffer
    w = np.empty(n)
    pm, pb = 1.0, 0.0  # sensitivities of m_T to the parameter and the buffer after step t
    for t in range(n - 1, -1, -1):
        gu = -lr[t] * pm  # m_t = m_{t-1} - eta_t u_t
        bt = beta[t]
        if bt == 0.0:  # u_t = g~_t; the buffer passes through unchanged
            gg = gu
        else:
            if nesterov:  # u_t = g~_t + beta_t b_t
                gg, gb = gu, pb + bt * gu
            else:  # u_t = b_t
                gg, gb = 0.0, pb + gu
            if t == first:  # b_t = g~_t
                gg += gb
                pb = 0.0
            else:  # b_t = beta_t b_{t-1} + (1 - d_t) g~_t
                gg += (1.0 - d[t]) * gb
                pb = bt * gb
        w[t] = -gg  # g~_t = g_t + lambda_t m_{t-1}
        pm = pm + wd[t] * gg
    return w


# -- built-in learning-rate schedules (torch.optim.lr_scheduler semantics, one call per step) --


def constant_schedule(learning_rate: float, steps: int) -> np.ndarray:
    """eta_t = eta for t = 1..T."""
    eta = check_positive("learning_rate", learning_rate)
    return np.full(check_int("steps", steps), eta)


def step_schedule(
    learning_rate: float, steps: int, *, step_size: int, gamma: float = 0.1
) -> np.ndarray:
    """eta_t = eta gamma^floor((t-1) / step_size), as ``StepLR`` stepped once per step."""
    eta = check_positive("learning_rate", learning_rate)
    n = check_int("steps", steps)
    size = check_int("step_size", step_size, minimum=1)
    g = check_positive("gamma", gamma)
    return eta * g ** (np.arange(n) // size).astype(float)


def cosine_schedule(
    learning_rate: float, steps: int, *, min_learning_rate: float = 0.0, period: int | None = None
) -> np.ndarray:
    """eta_t = eta_min + (eta - eta_min)(1 + cos(pi (t-1) / T_max)) / 2, t = 1..T.

    The closed form of ``CosineAnnealingLR(T_max=period)`` stepped once per step;
    ``period`` defaults to ``steps``.
    """
    eta = check_positive("learning_rate", learning_rate)
    n = check_int("steps", steps)
    eta_min = check_in_interval(
        "min_learning_rate", min_learning_rate, 0.0, eta, low_open=False, high_open=False
    )
    t_max = n if period is None else check_int("period", period, minimum=1)
    t_max = max(t_max, 1)
    return eta_min + (eta - eta_min) * (1.0 + np.cos(math.pi * np.arange(n) / t_max)) / 2.0


BUILTIN_SCHEDULES: tuple[str, ...] = ("constant", "step", "cosine")


def builtin_schedule(name: str, learning_rate: float, steps: int, **options: float) -> np.ndarray:
    """One of :data:`BUILTIN_SCHEDULES` by name; ``options`` go to the schedule function
    (``step``: ``step_size``, ``gamma``; ``cosine``: ``min_learning_rate``, ``period``)."""
    funcs = {"constant": constant_schedule, "step": step_schedule, "cosine": cosine_schedule}
    if name not in funcs:
        raise ValueError(f"`name` must be one of {', '.join(BUILTIN_SCHEDULES)}, got {name!r}.")
    return funcs[name](learning_rate, steps, **options)  # type: ignore[operator]
