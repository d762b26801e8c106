"""The published final-model audits' statistic, beside the valid ones, on the same scores.

The input-space audits of Annamalai and De Cristofaro (*Nearly Tight Black-Box Auditing of
Differentially Private Machine Learning*, arXiv 2405.14106) and of Yoon, Jeung and No
(*Adversarial Sample-Based Approach for Tighter Privacy Auditing in Final Model-Only
Scenarios*, arXiv 2412.01756) report, in their public code, this number:

1. for every distinct observed score t, the test "in iff score >= t" gives FP(t) and FN(t);
2. each rate gets a Clopper-Pearson upper bound at level 1 - alpha (alpha = 0.05 *per rate*,
   not split between the two);
3. ``mu(t) = Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)`` (0 if negative) is turned into the
   Gaussian-DP epsilon at delta (Dong, Roth, Su, arXiv 1905.02383, Cor. 2.13; a root searched
   on [0, 50], 0 when there is none);
4. the reported epsilon is the **maximum over all N thresholds**, with no correction.

Each per-threshold value holds at about 90% confidence (two rates at 95% each) *for a
threshold fixed in advance*; the maximum over N thresholds chosen on the same scores is not
a confidence bound at any stated level, and the Gaussian-DP conversion is an estimate
besides. :func:`published_gdp_epsilon` computes it, labelled ``kind="invalid"`` with
:data:`PUBLISHED_LABEL`. :func:`statistics_side_by_side` puts it next to the Gaussian-DP
estimate with a Bonferroni correction over every observed score (valid against "mu-GDP")
and our Clopper-Pearson lower bound, all from the same scores
(``docs/input_audit_protocols.md``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.audit._arrays import check_scores
from opacus_lastiterate.analysis.audit.clopper_pearson import upper_at_significance
from opacus_lastiterate.analysis.audit.error_counts import counts_at
from opacus_lastiterate.analysis.audit.gaussian_dp import GDP_ESTIMATE_NOTE, gdp_mu
from opacus_lastiterate.analysis.audit.result import AuditResult, MultiRunCounts
from opacus_lastiterate.analysis.audit.score_audit import ScoreAudit
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    DEFAULT_THRESHOLD_STRATEGY,
    Bonferroni,
    ThresholdStrategy,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon

__all__ = [
    "published_gdp_epsilon",
    "statistics_side_by_side",
]

PUBLISHED_LABEL = (
    "as published: not a valid confidence bound (maximum over {n} uncorrected thresholds)"
)
"""The label of :func:`published_gdp_epsilon` (``{n}``: the number of thresholds)."""

#: The published code searches the epsilon root on [0, 50] and reports 0 without a root.
PUBLISHED_ROOT_BRACKET = 50.0


def published_gdp_epsilon(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float = 1e-5,
    alpha: float = 0.05,
) -> AuditResult:
    """The published statistic (module docstring): the maximum over every observed score of
    per-threshold Gaussian-DP epsilons, each rate bounded at level 1 - ``alpha``.

    NOT a lower bound: ``kind="invalid"``, ``statistically_valid=False``, the first note is
    :data:`PUBLISHED_LABEL`. ``confidence`` in the result is the nominal per-threshold level
    of the pair of rates, ``1 - 2 alpha``.

    Args:
        in_scores, out_scores: the scores (higher = "in").
        delta: of the Gaussian-DP conversion, in (0, 1).
        alpha: per-rate significance of the published code (0.05), in (0, 0.5).
    """
    ins = np.sort(check_scores("in_scores", in_scores))
    outs = np.sort(check_scores("out_scores", out_scores))
    d = check_delta(delta)
    a = check_in_interval("alpha", alpha, 0.0, 0.5)
    thresholds = np.unique(np.concatenate([ins, outs]))
    fp, fn = counts_at(ins, outs, thresholds)
    fpr_ub = upper_at_significance(fp, outs.size, a)
    fnr_ub = upper_at_significance(fn, ins.size, a)
    mu = gdp_mu(fpr_ub, fnr_ub)
    # epsilon increases with mu: the maximum is at the largest mu whose root lies in the
    # published bracket (a larger one has no root there and counts as 0 in their code).
    eps_best, i = 0.0, int(np.argmax(mu))
    for j in np.argsort(-mu, kind="stable"):
        if mu[j] <= 0.0:
            break
        e = gaussian_epsilon(mu=float(mu[j]), delta=d)
        if e <= PUBLISHED_ROOT_BRACKET:
            eps_best, i = e, int(j)
            break
    n = int(thresholds.size)
    return AuditResult(
        epsilon=float(eps_best),
        delta=d,
        confidence=1.0 - 2.0 * a,
        method="gaussian-dp",
        kind="invalid",
        counts=MultiRunCounts(int(ins.size), int(outs.size), int(fp[i]), int(fn[i])),
        threshold=float(thresholds[i]),
        selection=(
            f"maximum over {n} thresholds (every observed score), each rate at significance "
            f"{a:g}, no correction"
        ),
        mu=float(mu[i]),
        statistically_valid=False,
        notes=(PUBLISHED_LABEL.format(n=n), GDP_ESTIMATE_NOTE),
    )


def statistics_side_by_side(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float = 1e-5,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> dict[str, AuditResult]:
    """The three statistics of one set of scores, in the order a report shows them.

    Returns:
        A dict with three entries: ``"as published"`` (:func:`published_gdp_epsilon` at
        alpha = 1 - confidence), ``"gaussian-dp bonferroni"`` (``ScoreAudit.gaussian_dp``
        with a Bonferroni correction: an estimate, valid against mu-GDP) and
        ``"clopper-pearson"`` (``ScoreAudit.clopper_pearson`` with ``threshold_strategy``:
        a lower bound).
    """
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    audit = ScoreAudit(in_scores, out_scores)
    return {
        "as published": published_gdp_epsilon(
            audit.in_scores, audit.out_scores, delta=delta, alpha=min(1.0 - c, 0.4999)
        ),
        "gaussian-dp bonferroni": audit.gaussian_dp(
            delta=delta, confidence=c, threshold_strategy=Bonferroni()
        ),
        "clopper-pearson": audit.clopper_pearson(
            delta=delta, confidence=c, threshold_strategy=threshold_strategy
        ),
    }

