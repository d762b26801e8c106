"""Empirical delta(epsilon) from simulated log-likelihood ratios (the likelihood-ratio audit).

Given the exact privacy loss L = log(p_upper / p_lower) of simulated outputs under both
hypotheses (:mod:`simulation`), the test "say upper when L > epsilon" is the Neyman-Pearson
test that attains the hockey-stick divergence at epsilon:

    delta(epsilon) = P_upper(L > epsilon) - e^epsilon P_lower(L > epsilon).

* :func:`threshold_delta` estimates both rates by counts and brackets delta with one-sided
  Clopper-Pearson bounds, Bonferroni-corrected over the two rates and all epsilons, so the
  whole band holds with probability at least ``confidence``. Its lower end is a valid
  *lower bound* on the mechanism's delta(epsilon) (the audit), up to simulation of the
  model.
* :func:`importance_delta` uses the identity delta(epsilon) = E_upper[(1 - e^(epsilon - L))_+]
  (samples under the upper hypothesis only, values in [0, 1]), with its standard error: an
  *estimate* with lower variance, used to check that a computed curve is tight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_in_interval
from opacus_lastiterate.analysis.audit.clopper_pearson import (
    clopper_pearson_lower,
    clopper_pearson_upper,
)

__all__ = [
    "importance_delta",
    "threshold_delta",
]


@dataclass(frozen=True)
class EmpiricalDelta:
    """delta(epsilon) estimated from samples, with a band.

    Attributes:
        epsilons: the epsilons (thresholds on the log-likelihood ratio).
        estimate: the point estimates.
        lower: lower ends of the band.
        upper: upper ends of the band.
        kind: ``"clopper-pearson band (simultaneous, level c)"`` or
            ``"estimate +/- z standard errors"``.
    """

    epsilons: NDArray[np.float64]
    estimate: NDArray[np.float64]
    lower: NDArray[np.float64]
    upper: NDArray[np.float64]
    kind: str


def _losses(name: str, values: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-D array, got shape {arr.shape}.")
    if np.isnan(arr).any():
        raise ValueError(f"`{name}` must not contain NaN.")
    return arr


def _epsilons(values: ArrayLike) -> NDArray[np.float64]:
    eps = np.atleast_1d(np.asarray(values, dtype=np.float64))
    if eps.ndim != 1 or eps.size == 0 or not np.all(np.isfinite(eps)):
        raise ValueError(
            f"`epsilons` must be a non-empty 1-D array of finite numbers, got {values!r}."
        )
    return eps


def threshold_delta(
    losses_upper: ArrayLike,
    losses_lower: ArrayLike,
    epsilons: ArrayLike,
    *,
    confidence: float = 0.95,
) -> EmpiricalDelta:
    """Counts of {L > epsilon} under both hypotheses, with a simultaneous Clopper-Pearson band:
    lower = CP_low(upper rate) - e^eps CP_high(lower rate), upper = the reverse."""
    up = _losses("losses_upper", losses_upper)
    low = _losses("losses_lower", losses_lower)
    eps = _epsilons(epsilons)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    each = 1.0 - (1.0 - c) / (2 * eps.size)
    k_up = (up[None, :] > eps[:, None]).sum(axis=1)
    k_low = (low[None, :] > eps[:, None]).sum(axis=1)
    scale = np.exp(eps)
    estimate = k_up / up.size - scale * k_low / low.size
    lower = clopper_pearson_lower(k_up, up.size, each) - scale * clopper_pearson_upper(
        k_low, low.size, each
    )
    upper = clopper_pearson_upper(k_up, up.size, each) - scale * clopper_pearson_lower(
        k_low, low.size, each
    )
    return EmpiricalDelta(
        eps,
        estimate,
        np.maximum(lower, 0.0),
        np.minimum(upper, 1.0),
        f"clopper-pearson band (simultaneous, level {c:g})",
    )


def importance_delta(
    losses_upper: ArrayLike, epsilons: ArrayLike, *, z: float = 4.0
) -> EmpiricalDelta:
    """Mean of (1 - e^(epsilon - L))_+ over samples under the upper hypothesis, +/- z standard
    errors (an estimate, not a bound)."""
    up = _losses("losses_upper", losses_upper)
    eps = _epsilons(epsilons)
    z = check_in_interval("z", z, 0.0, np.inf)
    with np.errstate(over="ignore"):
        values = np.maximum(-np.expm1(eps[:, None] - up[None, :]), 0.0)
    estimate = values.mean(axis=1)
    se = values.std(axis=1, ddof=1) / np.sqrt(up.size) if up.size > 1 else np.ones_like(eps)
    return EmpiricalDelta(
        eps,
        estimate,
        np.maximum(estimate - z * se, 0.0),
        np.minimum(estimate + z * se, 1.0),
        f"estimate +/- {z:g} standard errors",
    )
