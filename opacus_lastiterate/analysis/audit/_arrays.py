"""Array-argument checks for the audit statistics (scalars use ``analysis._validation``)."""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_int


def check_scores(name: str, values: ArrayLike) -> NDArray[np.float64]:
    """A non-empty one-dimensional array of finite real scores, returned as float64."""
    try:
        arr = np.asarray(values)
    except Exception as exc:  # pragma: no cover - numpy raises many types here
        raise TypeError(f"`{name}` must be a 1-D array of real numbers, got {values!r}.") from exc
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"`{name}` must be a 1-D array of real numbers, got dtype {arr.dtype}.")
    if arr.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"`{name}` must be non-empty, got an empty array.")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"`{name}` must contain finite numbers only, got NaN or inf.")
    return arr


def check_counts(name: str, values: object, *, maximum: int) -> int | NDArray[np.int64]:
    """An integer or an integer array with every entry in [0, ``maximum``]."""
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        k = check_int(name, values)
        if k > maximum:
            raise ValueError(f"`{name}` must be an integer in [0, {maximum}], got {k}.")
        return k
    arr = np.asarray(values)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"`{name}` must be an integer or an integer array, got {values!r} of dtype {arr.dtype}."
        )
    if arr.size and (arr.min() < 0 or arr.max() > maximum):
        raise ValueError(
            f"`{name}` must have every entry in [0, {maximum}], got values in "
            f"[{arr.min()}, {arr.max()}]."
        )
    return arr.astype(np.int64)
