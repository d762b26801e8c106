"""Exact (Clopper-Pearson) confidence bounds for a binomial proportion.

For k successes in n trials and confidence level c (``docs/auditing.md``,
"Clopper-Pearson intervals"):

    upper(k, n, c) = BetaInv(c; k + 1, n - k)          (1 when k = n)
    lower(k, n, c) = BetaInv(1 - c; k, n - k + 1)      (0 when k = 0)

Each one-sided bound holds with probability at least c for every true proportion; the
two-sided interval at level c is [lower(k, n, (1 + c)/2), upper(k, n, (1 + c)/2)].
For k = 0 the upper bound has the closed form 1 - (1 - c)^(1/n).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import betainccinv, betaincinv

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit._arrays import check_counts

__all__ = [
    "clopper_pearson_upper",
]


def _as_output(values: NDArray[np.float64], scalar: bool) -> float | NDArray[np.float64]:
    return float(values) if scalar else values


def upper_at_significance(k: NDArray[np.int64], n: int, significance: float) -> NDArray[np.float64]:
    """Unchecked upper bounds at level 1 - ``significance`` (package-internal).

    Uses the inverse of the *complemented* incomplete beta function, which stays accurate
    when ``significance`` is tiny (Bonferroni over many thresholds); ``1 - significance``
    would lose digits there.
    """
    out = np.ones(k.shape, dtype=np.float64)
    below = k < n
    out[below] = betainccinv(k[below] + 1.0, float(n) - k[below], significance)
    return out


def lower_at_significance(k: NDArray[np.int64], n: int, significance: float) -> NDArray[np.float64]:
    """Unchecked lower bounds at level 1 - ``significance`` (package-internal)."""
    out = np.zeros(k.shape, dtype=np.float64)
    above = k > 0
    out[above] = betaincinv(k[above].astype(float), float(n) - k[above] + 1.0, significance)
    return out


def clopper_pearson_upper(
    successes: int | ArrayLike, trials: int, confidence: float = 0.95
) -> float | NDArray[np.float64]:
    """One-sided upper confidence bound ``BetaInv(confidence; k + 1, n - k)`` (1 if k = n).

    Args:
        successes: k, an integer or an integer array with entries in [0, ``trials``].
        trials: n >= 1.
        confidence: the probability (over the data) that the bound is at least the truth.

    Returns:
        A float for an integer ``successes``, else an array of the same shape.
    """
    n = check_int("trials", trials, minimum=1)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    k = check_counts("successes", successes, maximum=n)
    scalar = isinstance(k, int)
    return _as_output(
        upper_at_significance(np.atleast_1d(np.asarray(k, dtype=np.int64)), n, 1.0 - c).reshape(
            np.shape(k)
        ),
        scalar,
    )


def clopper_pearson_lower(
    successes: int | ArrayLike, trials: int, confidence: float = 0.95
) -> float | NDArray[np.float64]:
    """One-sided lower confidence bound ``BetaInv(1 - confidence; k, n - k + 1)`` (0 if k = 0).

    Args and returns as for :func:`clopper_pearson_upper`.
    """
    n = check_int("trials", trials, minimum=1)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    k = check_counts("successes", successes, maximum=n)
    scalar = isinstance(k, int)
    return _as_output(
        lower_at_significance(np.atleast_1d(np.asarray(k, dtype=np.int64)), n, 1.0 - c).reshape(
            np.shape(k)
        ),
        scalar,
    )
