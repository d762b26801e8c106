"""Error rates -> epsilon lower bound with no assumption on the mechanism's shape.

(eps, delta)-DP implies, for every test with false-positive rate a and false-negative rate b
(Kairouz, Oh, Viswanath, "The Composition Theorem for Differential Privacy",
arXiv 1311.0776; ``docs/auditing.md``, "From error rates to epsilon"):

    a + e^eps b >= 1 - delta   and   b + e^eps a >= 1 - delta,

so, with *upper* confidence bounds a_ub, b_ub on the two rates,

    eps >= max( log((1 - delta - a_ub) / b_ub),  log((1 - delta - b_ub) / a_ub) )   (>= 0).

Both branches use the same two rate bounds, so taking the larger costs no confidence.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit._rates import check_rates
from opacus_lastiterate.analysis.audit.clopper_pearson import upper_at_significance
from opacus_lastiterate.analysis.audit.result import AuditResult, MultiRunCounts

__all__ = ["epsilon_bound_from_counts", "epsilon_from_error_rates"]


def pure_epsilon(
    fpr_upper: NDArray[np.float64], fnr_upper: NDArray[np.float64], delta: float
) -> NDArray[np.float64]:
    """Unchecked vectorised conversion (package-internal); see module docs."""
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.log(np.maximum(1.0 - delta - fpr_upper, 0.0)) - np.log(fnr_upper)
        second = np.log(np.maximum(1.0 - delta - fnr_upper, 0.0)) - np.log(fpr_upper)
    eps = np.fmax(first, second)  # NaN only from 0/0 (log 0 - log 0): no evidence
    return np.where(np.isnan(eps), 0.0, np.maximum(eps, 0.0))


def epsilon_from_error_rates(
    false_positive_rate: float | ArrayLike,
    false_negative_rate: float | ArrayLike,
    *,
    delta: float,
) -> float | NDArray[np.float64]:
    """``max(log((1-delta-FPR)/FNR), log((1-delta-FNR)/FPR), 0)`` (module docs).

    Pass *upper confidence bounds* on the rates to get an epsilon lower bound; the point
    estimates give only a point estimate. A zero rate with the other below ``1 - delta``
    gives ``inf`` (no finite epsilon is compatible).

    Args:
        false_positive_rate: FPR (or its upper bound), scalar or array, in [0, 1].
        false_negative_rate: FNR (or its upper bound), broadcastable, in [0, 1].
        delta: in [0, 1).
    """
    a, a_scalar = check_rates("false_positive_rate", false_positive_rate)
    b, b_scalar = check_rates("false_negative_rate", false_negative_rate)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    eps = pure_epsilon(a, b, d)
    return float(eps) if (a_scalar and b_scalar) else eps


def epsilon_bound_from_counts(
    false_positives: int,
    num_out: int,
    false_negatives: int,
    num_in: int,
    *,
    delta: float,
    confidence: float = 0.95,
) -> AuditResult:
    """Epsilon lower bound from the counts of ONE test whose threshold was fixed in advance.

    Clopper-Pearson upper bounds on FPR and FNR, each at significance (1 - confidence) / 2
    (union bound), converted as in the module docs. For scores, use
    :func:`~opacus_lastiterate.analysis.audit.audit_clopper_pearson`, which also chooses the
    threshold validly.
    """
    n_out = check_int("num_out", num_out, minimum=1)
    n_in = check_int("num_in", num_in, minimum=1)
    counts = MultiRunCounts(n_in, n_out, false_positives, false_negatives)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    half = 0.5 * (1.0 - c)
    a = upper_at_significance(np.array([counts.false_positives]), n_out, half)
    b = upper_at_significance(np.array([counts.false_negatives]), n_in, half)
    return AuditResult(
        epsilon=float(pure_epsilon(a, b, d)[0]),
        delta=d,
        confidence=c,
        method="clopper-pearson",
        kind="bound",
        counts=counts,
        selection="counts of one test fixed in advance",
    )
