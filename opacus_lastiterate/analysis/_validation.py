"""Argument checks shared by the whole package.

Every public function validates its arguments *before* it changes any state, and every
error names the parameter, its valid range and the value it was given, e.g.
``ValueError: `sample_rate` must be in (0, 1], got 1.5.``
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = [
    "check_delta",
    "check_epsilon",
    "check_in_interval",
    "check_int",
    "check_noise_multiplier",
    "check_positive",
    "check_real",
    "check_sample_rate",
    "check_step_noise",
    "check_step_noises",
    "check_steps",
]


def check_real(name: str, value: object) -> float:
    """Return ``value`` as a float; reject bools, non-numbers and NaN."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {value!r} of type {type(value).__name__}.")
    x = float(value)
    if math.isnan(x):
        raise ValueError(f"`{name}` must be a number, got NaN.")
    return x


def check_in_interval(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    low_open: bool = True,
    high_open: bool = True,
) -> float:
    """Return ``value`` as a float if it lies in the interval, else raise ``ValueError``."""
    x = check_real(name, value)
    ok_low = x > low if low_open else x >= low
    ok_high = x < high if high_open else x <= high
    if not (ok_low and ok_high):
        lb = "(" if low_open else "["
        rb = ")" if high_open else "]"
        lo = "-inf" if low == -math.inf else f"{low:g}"
        hi = "inf" if high == math.inf else f"{high:g}"
        raise ValueError(f"`{name}` must be in {lb}{lo}, {hi}{rb}, got {value!r}.")
    return x


def check_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """A real number in (0, inf) (or (0, inf] with ``allow_inf``)."""
    return check_in_interval(name, value, 0.0, math.inf, high_open=not allow_inf)


def check_int(name: str, value: object, *, minimum: int = 0) -> int:
    """An integer (Python or numpy, not bool, not float) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {value!r} of type {type(value).__name__}.")
    n = int(value)
    if n < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {n}.")
    return n


def check_delta(value: object, name: str = "delta") -> float:
    """delta in (0, 1)."""
    return check_in_interval(name, value, 0.0, 1.0)


def check_epsilon(value: object, name: str = "epsilon") -> float:
    """epsilon in [0, inf)."""
    return check_in_interval(name, value, 0.0, math.inf, low_open=False)


def check_sample_rate(value: object, name: str = "sample_rate") -> float:
    """Poisson sampling rate q in (0, 1]."""
    return check_in_interval(name, value, 0.0, 1.0, high_open=False)


def check_noise_multiplier(value: object, name: str = "noise_multiplier") -> float:
    """Noise multiplier sigma in (0, inf)."""
    return check_positive(name, value)


def check_steps(value: object, name: str = "steps", *, minimum: int = 0) -> int:
    """Number of steps, an integer >= ``minimum`` (0 by default)."""
    return check_int(name, value, minimum=minimum)


def check_step_noise(value: object, name: str = "noise_multiplier") -> float:
    """A step's noise multiplier: a real number in [0, inf) (Opacus accepts 0)."""
    return check_in_interval(name, value, 0.0, math.inf, low_open=False)


def check_step_noises(value: object, count: int, name: str = "noise_multiplier") -> np.ndarray:
    """Noise multipliers of ``count`` steps: one real number in [0, inf) for all of them, or
    a sequence of ``count`` such numbers (one per step)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (list, tuple, np.ndarray)):
        raw = np.asarray(value)
        if raw.dtype.kind not in "fiu":
            raise TypeError(f"`{name}` entries must be real numbers, got {raw.dtype} entries.")
        if raw.ndim != 1:
            raise ValueError(f"`{name}` must be one number or one per step, got shape {raw.shape}.")
        values = raw.astype(float)
        if values.size != count:
            raise ValueError(f"`{name}` must have one entry per step ({count}), got {values.size}.")
        if not np.all(np.isfinite(values) & (values >= 0.0)):
            raise ValueError(f"`{name}` entries must be finite and >= 0.")
        return values
    return np.full(count, check_step_noise(value, name))
