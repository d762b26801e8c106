"""Audits from attack scores: choose a threshold validly, bound, label the result.

Scores: one real number per run (multi-run) or per canary (one-run); higher means "the
canary was in" (negate scores that go the other way). Every function takes a
``threshold_strategy`` (default :class:`RankGridBonferroni`, valid) and records what it did.

- :func:`audit_clopper_pearson`: assumption-free epsilon lower bound from R runs
  (Clopper-Pearson rate bounds + pure (eps, delta) conversion, ``pure_dp.py``).
- :func:`audit_gaussian_dp`: mu lower bound and a Gaussian-DP epsilon ESTIMATE
  (``gaussian_dp.py``).
- :func:`audit_one_run`: the one-run bound of Steinke, Nasr, Jagielski (``one_run.py``),
  guessing "in" for the canaries scoring at least the threshold.
"""

from __future__ import annotations

from numpy.typing import ArrayLike

from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.audit._arrays import check_scores
from opacus_lastiterate.analysis.audit._selection import (
    OneRunStatistic,
    RateStatistic,
    Selected,
    select,
)
from opacus_lastiterate.analysis.audit.gaussian_dp import GDP_ESTIMATE_NOTE, gdp_epsilon, gdp_mu
from opacus_lastiterate.analysis.audit.one_run import warn_one_run
from opacus_lastiterate.analysis.audit.pure_dp import pure_epsilon
from opacus_lastiterate.analysis.audit.result import AuditResult
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    DEFAULT_THRESHOLD_STRATEGY,
    ThresholdStrategy,
)

__all__ = ["audit_clopper_pearson", "audit_gaussian_dp", "audit_one_run"]

_NAIVE_NOTE = (
    "threshold chosen on the same scores without correction: the stated confidence is not "
    "honest (failure rates of 8-11% at a nominal 5% are typical)."
)


def _check_strategy(strategy: object) -> ThresholdStrategy:
    if not isinstance(strategy, ThresholdStrategy):
        raise TypeError(
            f"`threshold_strategy` must be a ThresholdStrategy, got {strategy!r} of type "
            f"{type(strategy).__name__}."
        )
    return strategy


def _notes(strategy: ThresholdStrategy) -> tuple[str, ...]:
    return () if strategy.statistically_valid else (_NAIVE_NOTE,)


def audit_clopper_pearson(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditResult:
    """Assumption-free epsilon lower bound from the scores of runs with / without the canary.

    At a threshold, FPR and FNR get Clopper-Pearson upper bounds at half the significance
    each and ``eps >= max(log((1-delta-FPR_ub)/FNR_ub), log((1-delta-FNR_ub)/FPR_ub))``
    (``auditing.md``, "Pipeline", steps 4-6); the strategy decides the thresholds and the
    significance (``threshold_strategies.py``).

    Args:
        in_scores: scores of the runs trained with the canary (D').
        out_scores: scores of the runs trained without it (D).
        delta: in [0, 1).
        confidence: overall confidence of the bound, in (0, 1).
        threshold_strategy: default :class:`RankGridBonferroni`.
    """
    ins = check_scores("in_scores", in_scores)
    outs = check_scores("out_scores", out_scores)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    strategy = _check_strategy(threshold_strategy)
    stat = RateStatistic(lambda a, b: pure_epsilon(a, b, d))
    sel: Selected = select(strategy, stat, ins, outs, 1.0 - c)
    return AuditResult(
        epsilon=sel.value,
        delta=d,
        confidence=c,
        method="clopper-pearson",
        kind="bound",
        counts=sel.counts,
        threshold_strategy=strategy,
        threshold=sel.threshold,
        selection=sel.selection,
        statistically_valid=strategy.statistically_valid,
        notes=_notes(strategy),
    )


def audit_gaussian_dp(
    in_scores: ArrayLike,
    out_scores: ArrayLike,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditResult:
    """mu lower bound (valid against "mu-GDP") and its epsilon, labelled an ESTIMATE.

    ``mu >= Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)`` maximised over the strategy's thresholds
    (Nasr et al. 2023), then ``epsilon`` solves the GDP curve at ``delta`` (Dong, Roth, Su
    Cor. 2.13). The epsilon is a bound only if the trade-off curve is Gaussian.
    """
    ins = check_scores("in_scores", in_scores)
    outs = check_scores("out_scores", out_scores)
    d = check_delta(delta)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    strategy = _check_strategy(threshold_strategy)
    sel = select(strategy, RateStatistic(gdp_mu), ins, outs, 1.0 - c)
    return AuditResult(
        epsilon=gdp_epsilon(sel.value, d),
        delta=d,
        confidence=c,
        method="gaussian-dp",
        kind="estimate",
        counts=sel.counts,
        threshold_strategy=strategy,
        threshold=sel.threshold,
        selection=sel.selection,
        mu=sel.value,
        statistically_valid=strategy.statistically_valid,
        notes=(GDP_ESTIMATE_NOTE,) + _notes(strategy),
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
    """One-run epsilon lower bound from the scores of the included / excluded canaries.

    The auditor guesses "in" for every canary scoring >= the threshold and abstains on the
    rest (r guesses, v correct, m = number of canaries); see ``one_run.py``. The default
    :class:`RankGridBonferroni` tries "guess the top k" for k on a geometric grid fixed by m
    alone; :class:`Bonferroni` tries every observed score (significance / m each, which the
    delta term makes hopeless at large m). The split strategies use the held-out canaries
    only (their m is the held-out count; the selection canaries are part of the fixed data).

    Warns :class:`OneRunDeltaWarning` if ``2 m delta`` is not small and
    :class:`NonRandomizedInclusionWarning` if ``inclusion_randomized`` is False.
    """
    ins = check_scores("in_scores", in_scores)
    outs = check_scores("out_scores", out_scores)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    strategy = _check_strategy(threshold_strategy)
    if not isinstance(inclusion_randomized, bool):
        raise TypeError(f"`inclusion_randomized` must be a bool, got {inclusion_randomized!r}.")
    notes = warn_one_run(ins.size + outs.size, d, inclusion_randomized)
    sel = select(strategy, OneRunStatistic(d), ins, outs, 1.0 - c)
    return AuditResult(
        epsilon=sel.value,
        delta=d,
        confidence=c,
        method="one-run",
        kind="bound",
        counts=sel.counts,
        threshold_strategy=strategy,
        threshold=sel.threshold,
        selection=sel.selection,
        statistically_valid=strategy.statistically_valid and inclusion_randomized,
        notes=tuple(notes) + _notes(strategy),
    )
