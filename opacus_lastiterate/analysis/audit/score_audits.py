"""Shortcuts for one analysis of one pair of score arrays: each is one call on
:class:`~opacus_lastiterate.analysis.audit.ScoreAudit` (use the object when running several
analyses on the same scores: it validates and sorts them once).

- :func:`audit_clopper_pearson` = ``ScoreAudit(ins, outs).clopper_pearson(...)``
- :func:`audit_gaussian_dp` = ``ScoreAudit(ins, outs).gaussian_dp(...)``
- :func:`audit_one_run` = ``ScoreAudit(ins, outs, inclusion_randomized=...).one_run(...)``
"""

from __future__ import annotations

from numpy.typing import ArrayLike

from opacus_lastiterate.analysis.audit.result import AuditResult
from opacus_lastiterate.analysis.audit.score_audit import ScoreAudit
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    DEFAULT_THRESHOLD_STRATEGY,
    ThresholdStrategy,
)

__all__ = ["audit_clopper_pearson", "audit_gaussian_dp", "audit_one_run"]


def audit_clopper_pearson(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditResult:
    """Assumption-free epsilon lower bound from R runs; see :meth:`ScoreAudit.clopper_pearson`."""
    return ScoreAudit(in_scores, out_scores).clopper_pearson(
        delta=delta, confidence=confidence, threshold_strategy=threshold_strategy
    )


def audit_gaussian_dp(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditResult:
    """mu lower bound and Gaussian-DP epsilon ESTIMATE; see :meth:`ScoreAudit.gaussian_dp`."""
    return ScoreAudit(in_scores, out_scores).gaussian_dp(
        delta=delta, confidence=confidence, threshold_strategy=threshold_strategy
    )


def audit_one_run(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    inclusion_randomized: bool = True,
) -> AuditResult:
    """One-run epsilon lower bound from the included / excluded canaries' scores; see
    :meth:`ScoreAudit.one_run`."""
    return ScoreAudit(in_scores, out_scores, inclusion_randomized=inclusion_randomized).one_run(
        delta=delta, confidence=confidence, threshold_strategy=threshold_strategy
    )
