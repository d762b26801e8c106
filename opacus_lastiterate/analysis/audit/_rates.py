"""Checks for error-rate arguments (scalars or arrays in [0, 1])."""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_in_interval


def check_rates(name: str, values: float | ArrayLike) -> tuple[NDArray[np.float64], bool]:
    """Return (float array, is_scalar) after checking every entry is in [0, 1]."""
    if isinstance(values, numbers.Real) and not isinstance(values, bool):
        x = check_in_interval(name, values, 0.0, 1.0, low_open=False, high_open=False)
        return np.asarray(x, dtype=np.float64), True
    arr = np.asarray(values)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise TypeError(f"`{name}` must be a real number or array, got {values!r}.")
    arr = arr.astype(np.float64)
    if np.any(np.isnan(arr)) or np.any((arr < 0.0) | (arr > 1.0)):
        raise ValueError(f"`{name}` must have every entry in [0, 1], got {values!r}.")
    return arr, False
