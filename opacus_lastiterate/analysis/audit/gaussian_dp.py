"""Gaussian differential privacy (GDP): a mu lower bound and its (eps, delta) conversion.

mu-GDP (Dong, Roth, Su 2019, arXiv:1905.02383) means every test has FNR >= Phi(Phi^-1(1 - FPR)
- mu), so upper confidence bounds a_ub, b_ub on (FPR, FNR) give the valid bound

    mu >= Phi^-1(1 - a_ub) - Phi^-1(b_ub)        (clamped at 0)

*against the claim "the mechanism is mu-GDP"*. Its (eps, delta) value (their Cor. 2.13)

    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)

(:func:`~opacus_lastiterate.analysis.baselines.gaussian_mechanism.gaussian_epsilon`)
is an ESTIMATE of the mechanism's epsilon: it is a bound only when the true trade-off curve
is Gaussian (e.g. full-batch DP-GD); for other curves it can exceed the truth (a pure eps = 1
Laplace mechanism audits at about 4; ``docs/auditing.md``, "Gaussian-DP estimates"). Results are
labelled ``kind="estimate"``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_int,
)
from opacus_lastiterate.analysis.audit.clopper_pearson import upper_at_significance
from opacus_lastiterate.analysis.audit.result import AuditResult, MultiRunCounts
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon

__all__ = [
    "gaussian_dp_estimate_from_counts",
]

GDP_ESTIMATE_NOTE = (
    "Gaussian-DP conversion: valid only if the mechanism's trade-off curve is Gaussian; "
    "otherwise it can exceed the true epsilon."
)


def gdp_mu(fpr_upper: NDArray[np.float64], fnr_upper: NDArray[np.float64]) -> NDArray[np.float64]:
    """Unchecked vectorised ``max(0, Phi^-1(1 - a) - Phi^-1(b))`` (package-internal)."""
    with np.errstate(invalid="ignore"):
        mu = norm.isf(fpr_upper) - norm.ppf(fnr_upper)
    return np.where(np.isnan(mu), 0.0, np.maximum(mu, 0.0))


def gaussian_dp_estimate_from_counts(
    false_positives: int,
    num_out: int,
    false_negatives: int,
    num_in: int,
    *,
    delta: float,
    confidence: float = 0.95,
) -> AuditResult:
    """mu lower bound and GDP epsilon ESTIMATE from the counts of one pre-set test.

    Clopper-Pearson upper bounds at significance (1 - confidence) / 2 per rate; ``mu`` in the
    result is a valid lower bound against "mu-GDP", ``epsilon`` is an estimate.
    """
    n_out = check_int("num_out", num_out, minimum=1)
    n_in = check_int("num_in", num_in, minimum=1)
    counts = MultiRunCounts(n_in, n_out, false_positives, false_negatives)
    d = check_delta(delta)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    half = 0.5 * (1.0 - c)
    a = upper_at_significance(np.array([counts.false_positives]), n_out, half)
    b = upper_at_significance(np.array([counts.false_negatives]), n_in, half)
    mu = float(gdp_mu(a, b)[0])
    return AuditResult(
        epsilon=gaussian_epsilon(mu=mu, delta=d),
        delta=d,
        confidence=c,
        method="gaussian-dp",
        kind="estimate",
        counts=counts,
        selection="counts of one test fixed in advance",
        mu=mu,
        notes=(GDP_ESTIMATE_NOTE,),
    )
