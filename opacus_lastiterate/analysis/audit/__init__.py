"""Statistics of privacy auditing: turn an attack's success into an honest epsilon.

numpy/scipy only (no torch, no opacus). Every number is labelled: ``kind="bound"`` for an
assumption-free lower bound (Clopper-Pearson, one-run, one-run f-DP against the
(eps, delta) curve), ``kind="estimate"`` for the Gaussian-DP conversions (multi-run and
one-run f-DP against mu-GDP), ``kind="invalid"`` when the procedure's confidence is not
honest (:class:`NaiveMax`, one-run canaries not included by fair coins). Thresholds are
chosen validly by default (:class:`RankGridBonferroni`).

Typical use::

    from opacus_lastiterate.analysis.audit import ScoreAudit, plan_multi_run_audit
    print(plan_multi_run_audit(1000, delta=1e-5))          # before training
    audit = ScoreAudit(in_scores, out_scores)              # validated and sorted once
    print(audit.clopper_pearson(delta=1e-5), audit.auroc())

One audit surface: :class:`ScoreAudit`. :func:`audit_clopper_pearson`,
:func:`audit_gaussian_dp`, :func:`audit_one_run` and the auditing, runner and in-training
audits are each one call on it (``docs/auditing.md``, "Statistics", lists them).

The published final-model audits' statistic (a maximum of per-threshold Gaussian-DP values
over every threshold, no correction; ``kind="invalid"``) is :func:`published_gdp_epsilon`;
:func:`statistics_side_by_side` shows it beside the Bonferroni Gaussian-DP estimate and the
Clopper-Pearson bound of the same scores.

Below it, the counts-level statistics that ScoreAudit applies at its selected threshold
(:func:`epsilon_bound_from_counts`, :func:`gaussian_dp_estimate_from_counts`,
:func:`one_run_epsilon_bound`, :func:`one_run_fdp_bound`) audit given counts (no scores).
"""

from opacus_lastiterate.analysis.audit.clopper_pearson import clopper_pearson_upper
from opacus_lastiterate.analysis.audit.error_counts import ErrorCurve, error_curve
from opacus_lastiterate.analysis.audit.gaussian_dp import (
    gaussian_dp_estimate_from_counts,
)
from opacus_lastiterate.analysis.audit.one_run import (
    one_run_epsilon_bound,
)
from opacus_lastiterate.analysis.audit.one_run_fdp import (
    one_run_fdp_bound,
)
from opacus_lastiterate.analysis.audit.planning import (
    AuditPlan,
    plan_multi_run_audit,
    plan_one_run_audit,
)
from opacus_lastiterate.analysis.audit.published import (
    published_gdp_epsilon,
    statistics_side_by_side,
)
from opacus_lastiterate.analysis.audit.pure_dp import (
    epsilon_bound_from_counts,
    epsilon_from_error_rates,
)
from opacus_lastiterate.analysis.audit.result import AuditResult
from opacus_lastiterate.analysis.audit.score_audit import ScoreAudit
from opacus_lastiterate.analysis.audit.score_audits import (
    audit_clopper_pearson,
    audit_gaussian_dp,
    audit_one_run,
)
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    Bonferroni,
    ExplicitThreshold,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    RankGridBonferroni,
    ThresholdStrategy,
)
from opacus_lastiterate.exceptions import (
    AuditWarning,
    OneRunDeltaWarning,
)

__all__ = [
    "AuditPlan",
    "AuditResult",
    "AuditWarning",
    "Bonferroni",
    "ErrorCurve",
    "ExplicitThreshold",
    "HeldOutSplit",
    "MultiSplit",
    "NaiveMax",
    "OneRunDeltaWarning",
    "RankGridBonferroni",
    "ScoreAudit",
    "ThresholdStrategy",
    "audit_clopper_pearson",
    "audit_gaussian_dp",
    "audit_one_run",
    "clopper_pearson_upper",
    "epsilon_bound_from_counts",
    "epsilon_from_error_rates",
    "error_curve",
    "gaussian_dp_estimate_from_counts",
    "one_run_epsilon_bound",
    "one_run_fdp_bound",
    "plan_multi_run_audit",
    "plan_one_run_audit",
    "published_gdp_epsilon",
    "statistics_side_by_side",
]
