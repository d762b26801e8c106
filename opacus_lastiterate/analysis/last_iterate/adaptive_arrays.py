"""The frozen-second-moment weights of an adaptive optimiser's run given as per-step arrays.

The computation of :mod:`.adaptive_weights` (its module docstring gives the model: the
expected second moment, the step coefficients of the linear recursion, the weights found
backwards) on one numpy array per setting that changes from step to step
(:class:`StepArrays`) and the run's options, with no Python object per step: the list API
of :mod:`.adaptive_weights` turns its settings into these arrays, and a run kept as columns
(:mod:`.adaptive_columns`) repeats its runs' values into them. The floats are those of a
loop over the steps in Python: the recursions are filtered in the loop's order of operations
(:func:`linear_recursion`) and the powers taken with Python's own ``pow``
(:func:`python_powers`; numpy's vectorised power may differ in the last bit). Inputs are
trusted (validated by the caller).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from scipy import special
from scipy.signal import lfilter

__all__: list[str] = []  # internals of adaptive_weights and adaptive_columns

ADAM_FAMILY = ("adam", "adamw", "nadam", "radam")
_ADAMAX_GRID = 4096  # points of the grid on which Adamax's expected state is integrated
_ADAMAX_RANGE = 10.0  # the grid reaches 10 noise standard deviations (+ eps)


class StepArrays(NamedTuple):
    """The settings of each step that may change during a run, one float array each (the
    fields of :class:`~.adaptive_weights.AdaptiveSettings` of those names)."""

    lr: np.ndarray
    beta1: np.ndarray
    beta2: np.ndarray
    eps: np.ndarray
    weight_decay: np.ndarray
    lr_decay: np.ndarray
    initial_accumulator_value: np.ndarray
    momentum_decay: np.ndarray


def python_powers(base: np.ndarray | Iterable[float], exponent: Iterable[float]) -> np.ndarray:
    """``base ** exponent`` elementwise by Python's float power (the C library's ``pow``):
    the floats a loop over Python floats gives."""
    return np.array(list(map(pow, np.asarray(base, dtype=float).tolist(), exponent)), dtype=float)


def linear_recursion(coef: np.ndarray, x: np.ndarray, start: float = 0.0) -> np.ndarray:
    """y_t = coef_t y_{t-1} + x_t from y_{-1} = ``start``, with the floats of that loop in
    Python (one filter per run of one coef: its operations are the loop's)."""
    n = len(x)
    y = np.empty(n)
    if not n:
        return y
    starts = np.flatnonzero(np.append(True, coef[1:] != coef[:-1])).tolist()
    if len(starts) > n // 16 + 16:  # coef changing at most steps: the loop itself
        last = start
        for t, (b, xt) in enumerate(zip(coef.tolist(), x.tolist(), strict=True)):
            last = y[t] = b * last + xt
        return y
    last = start
    for i, j in zip(starts, [*starts[1:], n], strict=True):
        b = float(coef[i])
        y[i:j] = lfilter([1.0], [1.0, -b], x[i:j], zi=[b * last])[0]
        last = float(y[j - 1])
    return y


def expected_state(
    name: str, centered: bool, arrays: StepArrays, noise_std: np.ndarray
) -> np.ndarray:
    """The expected second-moment state of each step
    (:func:`~.adaptive_weights.expected_second_moment`)."""
    s2 = noise_std**2
    if name == "adagrad":
        return float(arrays.initial_accumulator_value[0]) + np.cumsum(s2)
    if name == "adamax":
        return _adamax_expected_state(arrays.beta2, arrays.eps, np.sqrt(s2))
    beta2 = arrays.beta2
    v = linear_recursion(beta2, (1.0 - beta2) * s2)
    if not centered:
        return v - 0.0
    square = python_powers(beta2, [2] * len(beta2))
    b = linear_recursion(square, python_powers(1.0 - beta2, [2] * len(beta2)) * s2)
    return v - b


def _adamax_expected_state(beta2: np.ndarray, eps: np.ndarray, s: np.ndarray) -> np.ndarray:
    top = _ADAMAX_RANGE * float(s.max()) + float(eps.max())
    x = np.linspace(0.0, top, _ADAMAX_GRID)
    cdf = np.ones_like(x)  # P(u_0 <= x), u_0 = 0
    out = np.empty(len(beta2))
    steady, key = False, None
    for t, b2 in enumerate(beta2.tolist()):
        step_key = (b2, eps[t], s[t])
        if steady and step_key == key:  # an unchanged step at its fixed point
            out[t] = out[t - 1]
            continue
        prev = np.interp(x / b2, x, cdf, right=1.0) if b2 > 0 else np.ones_like(x)
        half_normal = special.erf(np.maximum(x - eps[t], 0.0) / (s[t] * math.sqrt(2.0)))
        new = prev * half_normal
        # below 1e-13 a step changes E[u] by less than 1e-13 x the grid length: steady state
        steady, key = step_key == key and bool(np.max(np.abs(new - cdf)) < 1e-13), step_key
        cdf = new
        out[t] = np.trapezoid(1.0 - cdf, x)
    return out


def step_coefficients(
    name: str, decoupled: bool, amsgrad: bool, arrays: StepArrays, state: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(beta, k, a, c, d, lam) per step for the recursion of :mod:`.adaptive_weights`.

    Raises:
        ValueError: a step that divides by a zero second moment (named).
    """
    lr, beta1, beta2, eps, wd = arrays[:5]
    n = len(lr)
    t = np.arange(1, n + 1)
    beta, k, a, c = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    d, lam = np.ones(n), np.zeros(n)
    if amsgrad:
        state = np.maximum.accumulate(state)
    if decoupled:
        d = np.where(wd != 0.0, 1.0 - lr * wd, 1.0)
    else:
        lam = wd + 0.0
    bc1 = 1.0 - python_powers(beta1, range(1, n + 1))
    bc2 = 1.0 - python_powers(beta2, range(1, n + 1))
    if name in ADAM_FAMILY or name == "adamax":
        beta, k = beta1 + 0.0, 1.0 - beta1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if name in ("adam", "adamw"):
            denom = bc1 * (np.sqrt(state) / np.sqrt(bc2) + eps)
            c = lr / denom
        elif name == "nadam":
            psi = arrays.momentum_decay
            mu = beta1 * (1.0 - 0.5 * python_powers(np.full(n, 0.96), (t * psi).tolist()))
            mu_next = beta1 * (
                1.0 - 0.5 * python_powers(np.full(n, 0.96), ((t + 1) * psi).tolist())
            )
            mu_product = np.multiply.accumulate(mu)
            denom = np.sqrt(state / bc2) + eps
            a = lr * (1.0 - mu) / (1.0 - mu_product) / denom
            c = lr * mu_next / (1.0 - mu_product * mu_next) / denom
        elif name == "radam":  # divides by sqrt(v) + eps once rectified only
            factors, rectified = _radam_factors(t, beta2, bc2, np.sqrt(state) + eps)
            denom = np.where(rectified, np.sqrt(state) + eps, 1.0)
            c = lr / bc1 * factors
        elif name == "adamax":
            denom = bc1 * state
            c = lr / denom
        elif name == "rmsprop":
            denom = np.sqrt(state) + eps
            heavy = beta1 > 0  # the buffer, if any, passes through untouched without
            beta = np.where(heavy, beta1, 1.0)
            k = np.where(heavy, 1.0 / denom, 0.0)
            c = np.where(heavy, lr, 0.0)
            a = np.where(heavy, 0.0, lr / denom)
        else:  # adagrad
            denom = np.sqrt(state) + eps
            a = lr / (1.0 + (t - 1) * arrays.lr_decay) / denom
    zero = np.flatnonzero(denom == 0.0)
    if zero.size:
        i = int(zero[0])
        raise ValueError(
            f"step {i} divides by a zero second moment (`second_moment[{i}]` = "
            f"{state[i]!r} with eps = {float(eps[i])!r}); give a positive noise_std or eps."
        )
    return beta, k, a, c, d, lam


def _radam_factors(
    t: np.ndarray, beta2: np.ndarray, bc2: np.ndarray, denom: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """RAdam's r_t sqrt(1 - beta2^t) / (sqrt(v_t) + eps) once rho_t > 5, else 1; and
    where rho_t > 5."""
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * t * python_powers(beta2, t.tolist()) / bc2
    out = np.ones(len(t))
    on = rho_t > 5.0
    r, ri = rho_t[on], rho_inf[on]
    rect = np.sqrt((r - 4) * (r - 2) * ri / ((ri - 4) * (ri - 2) * r))
    out[on] = rect * np.sqrt(bc2[on]) / denom[on]
    return out, on


def backward_weights(
    beta: np.ndarray, k: np.ndarray, a: np.ndarray, c: np.ndarray, d: np.ndarray, lam: np.ndarray
) -> np.ndarray:
    """w_t = -d p_T / d g_t of p_t = d_t p - (a_t + c_t k_t) g~_t - c_t beta_t m,
    m_t = beta_t m + k_t g~_t, g~_t = g_t + lam_t p (adjoint, backwards in time); without L2
    decay (lam = 0) in numpy, with the floats of the loop."""
    n = beta.size
    if lam.any():
        w = np.empty(n)
        pp, pm = 1.0, 0.0  # d p_T / d p_t and d p_T / d m_t after step t
        for t in range(n - 1, -1, -1):
            gg = -(a[t] + c[t] * k[t]) * pp + k[t] * pm  # d p_T / d g~_t
            w[t] = -gg
            pp, pm = d[t] * pp + lam[t] * gg, beta[t] * (pm - c[t] * pp)
        return w
    # dp = pp after step t: d_{t+1} ... d_T; r_t = pm - c_t pp obeys
    # r_t = beta_{t+1} r_{t+1} - c_t pp, and dm = pm after step t = beta_{t+1} r_{t+1}
    dp = np.multiply.accumulate(np.concatenate(([1.0], d[:0:-1])))[::-1]
    r = linear_recursion(np.concatenate(([0.0], beta[:0:-1])), -(c * dp)[::-1])[::-1]
    dm = np.append(beta[1:] * r[1:], 0.0)
    return -(-(a + c * k) * dp + k * dm)


def array_weights(
    name: str,
    decoupled: bool,
    amsgrad: bool,
    centered: bool,
    arrays: StepArrays,
    noise_std: np.ndarray,
) -> np.ndarray:
    """The weights w_1..w_T of the run (:func:`~.adaptive_weights.adaptive_weights`)."""
    if not len(noise_std):
        return np.zeros(0)
    state = expected_state(name, centered, arrays, noise_std)
    return backward_weights(*step_coefficients(name, decoupled, amsgrad, arrays, state))
