"""One object for every analysis of one set of attack scores.

:class:`ScoreAudit` takes the scores of the runs (or canaries) with and without the canary,
validates and sorts them once, and offers each analysis as a method that returns a labelled
:class:`~opacus_lastiterate.analysis.audit.AuditResult` (or a plain number for the
descriptive metrics):

=====================  ==========================================  ==================
method                 what                                        label
=====================  ==========================================  ==================
``clopper_pearson``    pure (eps, delta) bound from R runs          ``"bound"``
``gaussian_dp``        mu bound, Gaussian-DP epsilon (R runs)       ``"estimate"``
``one_run``            Steinke, Nasr, Jagielski (one run)           ``"bound"``
``one_run_fdp``        Mahloujifar, Melis, Chaudhuri (one run)      ``"bound"`` for
                                                                    ``family="epsilon-delta"``,
                                                                    ``"estimate"`` for
                                                                    ``"gaussian"``
``auroc``              area under the ROC curve                     point estimate
``tpr_at_fpr``         best TPR at a given FPR                      point estimate
``error_curve``        FP / FN at every observed score              counts
=====================  ==========================================  ==================

A naive threshold maximum (:class:`NaiveMax`) or one-run canaries not included by fair coins
turn any label into ``"invalid"``. Higher scores mean "the canary was in". Usage:
:mod:`opacus_lastiterate.analysis.audit` and ``docs/auditing.md``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.audit._arrays import check_scores
from opacus_lastiterate.analysis.audit._rates import check_rates
from opacus_lastiterate.analysis.audit._selection import (
    FdpOneRunStatistic,
    OneRunStatistic,
    RateStatistic,
    Scores,
    Selected,
    Statistic,
)
from opacus_lastiterate.analysis.audit.error_counts import ErrorCurve, counts_at
from opacus_lastiterate.analysis.audit.gaussian_dp import GDP_ESTIMATE_NOTE, gdp_mu
from opacus_lastiterate.analysis.audit.one_run import warn_one_run
from opacus_lastiterate.analysis.audit.one_run_fdp import TradeOffFamily, check_family, fdp_result
from opacus_lastiterate.analysis.audit.pure_dp import pure_epsilon
from opacus_lastiterate.analysis.audit.result import AuditResult, result_kind
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    DEFAULT_THRESHOLD_STRATEGY,
    ThresholdStrategy,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon

__all__ = ["ScoreAudit"]

NAIVE_NOTE = (
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


def _check_confidence(confidence: object) -> float:
    return check_in_interval("confidence", confidence, 0.0, 1.0)


def _check_delta_closed(delta: object) -> float:
    return check_in_interval("delta", delta, 0.0, 1.0, low_open=False)


class ScoreAudit:
    """Attack scores with / without the canary, validated and sorted once; every analysis.

    Args:
        in_scores: scores of the runs trained with the canary (multi-run), or of the
            canaries that were included (one-run).
        out_scores: scores of the runs without it, or of the excluded canaries.
        inclusion_randomized: one-run audits only: whether each canary was included by an
            independent fair coin (the one-run theorems need it; False makes the one-run
            results ``kind="invalid"`` and warns :class:`NonRandomizedInclusionWarning`).
    """

    def __init__(
        self, in_scores: ArrayLike, out_scores: ArrayLike, *, inclusion_randomized: bool = True
    ) -> None:
        if not isinstance(inclusion_randomized, bool):
            raise TypeError(f"`inclusion_randomized` must be a bool, got {inclusion_randomized!r}.")
        self._scores = Scores.of(
            check_scores("in_scores", in_scores), check_scores("out_scores", out_scores)
        )
        self._inclusion_randomized = inclusion_randomized

    @classmethod
    def from_canaries(
        cls, scores: ArrayLike, included: ArrayLike, *, inclusion_randomized: bool = True
    ) -> ScoreAudit:
        """One-run form: one score per canary and its inclusion coin (True = included)."""
        s = check_scores("scores", scores)
        inc = np.asarray(included)
        if inc.dtype != bool:
            raise TypeError(f"`included` must be a boolean array, got dtype {inc.dtype}.")
        if inc.shape != s.shape:
            raise ValueError(
                f"`included` must have the shape of `scores` {s.shape}, got {inc.shape}."
            )
        return cls(s[inc], s[~inc], inclusion_randomized=inclusion_randomized)

    # -- data -------------------------------------------------------------------------

    @property
    def in_scores(self) -> NDArray[np.float64]:
        """The in-scores, ascending (read-only)."""
        return self._scores.ins

    @property
    def out_scores(self) -> NDArray[np.float64]:
        """The out-scores, ascending (read-only)."""
        return self._scores.outs

    @property
    def num_in(self) -> int:
        return int(self._scores.ins.size)

    @property
    def num_out(self) -> int:
        return int(self._scores.outs.size)

    @property
    def inclusion_randomized(self) -> bool:
        return self._inclusion_randomized

    def __repr__(self) -> str:
        return f"ScoreAudit(num_in={self.num_in}, num_out={self.num_out})"

    def _select(
        self, strategy: object, stat: Statistic, confidence: float
    ) -> tuple[ThresholdStrategy, Selected, dict[str, object]]:
        s = _check_strategy(strategy)
        sel = s.select(stat, self._scores, 1.0 - confidence)
        fields: dict[str, object] = {
            "counts": sel.counts,
            "threshold_strategy": s,
            "threshold": sel.threshold,
            "selection": sel.selection,
        }
        return s, sel, fields

    # -- multi-run analyses -------------------------------------------------------------

    def clopper_pearson(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    ) -> AuditResult:
        """Assumption-free epsilon lower bound from R runs (``kind="bound"``).

        At a threshold, FPR and FNR get Clopper-Pearson upper bounds at half the
        significance each and ``eps >= max(log((1-delta-FPR_ub)/FNR_ub),
        log((1-delta-FNR_ub)/FPR_ub))`` (``pure_dp.py``); the strategy decides the thresholds
        and the significance (``threshold_strategies.py``).
        """
        d = _check_delta_closed(delta)
        c = _check_confidence(confidence)
        stat = RateStatistic(lambda a, b: pure_epsilon(a, b, d))
        s, sel, fields = self._select(threshold_strategy, stat, c)
        valid = s.statistically_valid
        return AuditResult(
            epsilon=sel.value,
            delta=d,
            confidence=c,
            method="clopper-pearson",
            kind=result_kind("bound", valid),
            statistically_valid=valid,
            notes=() if valid else (NAIVE_NOTE,),
            **fields,  # type: ignore[arg-type]
        )

    def gaussian_dp(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    ) -> AuditResult:
        """mu lower bound (valid against "mu-GDP") and its epsilon, an ESTIMATE.

        ``mu >= Phi^-1(1 - FPR_ub) - Phi^-1(FNR_ub)`` at the strategy's thresholds (Nasr et
        al. 2023), then ``epsilon`` solves the GDP curve at ``delta`` (Dong, Roth, Su Cor.
        2.13). The epsilon is a bound only if the trade-off curve is Gaussian.
        """
        d = check_delta(delta)
        c = _check_confidence(confidence)
        s, sel, fields = self._select(threshold_strategy, RateStatistic(gdp_mu), c)
        valid = s.statistically_valid
        return AuditResult(
            epsilon=gaussian_epsilon(mu=sel.value, delta=d),
            delta=d,
            confidence=c,
            method="gaussian-dp",
            kind=result_kind("estimate", valid),
            mu=sel.value,
            statistically_valid=valid,
            notes=(GDP_ESTIMATE_NOTE,) + (() if valid else (NAIVE_NOTE,)),
            **fields,  # type: ignore[arg-type]
        )

    # -- one-run analyses ----------------------------------------------------------------

    def _one_run_notes(self, delta: float, strategy: object) -> tuple[bool, tuple[str, ...]]:
        s = _check_strategy(strategy)
        notes = warn_one_run(self.num_in + self.num_out, delta, self._inclusion_randomized)
        if not s.statistically_valid:
            notes.append(NAIVE_NOTE)
        return s.statistically_valid and self._inclusion_randomized, tuple(notes)

    def one_run(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    ) -> AuditResult:
        """One-run epsilon lower bound (Steinke, Nasr, Jagielski 2023; ``one_run.py``).

        The auditor guesses "in" for every canary scoring >= the threshold and abstains on
        the rest (r guesses, v correct, m = number of canaries). :class:`RankGridBonferroni`
        (default) tries "guess the top k" for k on a geometric grid fixed by m alone;
        :class:`Bonferroni` tries every observed score (significance / m each). The split
        strategies use the held-out canaries only. Warns :class:`OneRunDeltaWarning` if
        ``2 m delta`` is not small.
        """
        d = _check_delta_closed(delta)
        c = _check_confidence(confidence)
        valid, notes = self._one_run_notes(d, threshold_strategy)
        _, sel, fields = self._select(threshold_strategy, OneRunStatistic(d), c)
        return AuditResult(
            epsilon=sel.value,
            delta=d,
            confidence=c,
            method="one-run",
            kind=result_kind("bound", valid),
            statistically_valid=valid,
            notes=notes,
            **fields,  # type: ignore[arg-type]
        )

    def one_run_fdp(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        family: TradeOffFamily = "epsilon-delta",
        threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    ) -> AuditResult:
        """One-run audit against an f-DP claim (Mahloujifar, Melis, Chaudhuri 2024;
        ``one_run_fdp.py``), same guesses as :meth:`one_run`.

        ``family="epsilon-delta"`` (default): the claim is the (eps, delta)-DP trade-off
        curve itself, so the epsilon is an assumption-free lower bound (``kind="bound"``).
        ``family="gaussian"``: the claim is mu-GDP (jax_privacy's ``epsilon_one_run_fdp``);
        ``mu`` is a valid bound against "mu-GDP", the epsilon an ESTIMATE (about twice the
        (eps, delta) value on Gaussian scores, but it can exceed the true epsilon of a
        non-Gaussian mechanism); needs ``delta > 0``.
        """
        fam = check_family(family)
        d = check_delta(delta) if fam == "gaussian" else _check_delta_closed(delta)
        c = _check_confidence(confidence)
        valid, notes = self._one_run_notes(0.0, threshold_strategy)
        _, sel, fields = self._select(threshold_strategy, FdpOneRunStatistic(d, fam), c)
        return fdp_result(sel.value, fam, d, c, statistically_valid=valid, notes=notes, **fields)

    # -- descriptive metrics (point estimates, no confidence) ----------------------------

    def error_curve(self) -> ErrorCurve:
        """FP and FN of the test "in iff score >= t" at every distinct observed score."""
        ins, outs = self._scores.ins, self._scores.outs
        thresholds = np.unique(np.concatenate([ins, outs]))
        fp, fn = counts_at(ins, outs, thresholds)
        for a in (thresholds, fp, fn):
            a.flags.writeable = False
        return ErrorCurve(thresholds, fp, fn, ins.size, outs.size)

    def _roc(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(FPR, TPR) of every threshold test, from "nothing in" to "everything in"."""
        ins, outs = self._scores.ins, self._scores.outs
        thresholds = np.r_[np.inf, np.unique(np.concatenate([ins, outs]))[::-1]]
        fp, fn = counts_at(ins, outs, thresholds)
        return fp / outs.size, (ins.size - fn) / ins.size

    def _roc_hull(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Upper concave hull of the ROC points with (0, 0) and (1, 1): the randomised tests."""
        x, y = self._roc()
        hx: list[float] = []
        hy: list[float] = []
        for px, py in zip(np.r_[0.0, x, 1.0], np.r_[0.0, y, 1.0], strict=True):
            while len(hx) >= 2 and (
                (hx[-1] - hx[-2]) * (py - hy[-2]) - (hy[-1] - hy[-2]) * (px - hx[-2]) >= 0
            ):
                hx.pop()
                hy.pop()
            hx.append(float(px))
            hy.append(float(py))
        return np.array(hx), np.array(hy)

    def auroc(self, *, convex_hull: bool = False) -> float:
        """Area under the ROC curve: Pr[in-score > out-score] + Pr[tie] / 2 (a point estimate).

        ``convex_hull=True``: area under the ROC convex hull (the randomised threshold tests;
        what jax_privacy's ``attack_auroc`` reports), never smaller.
        """
        x, y = self._roc_hull() if convex_hull else self._roc()
        return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2.0))

    def tpr_at_fpr(self, fpr: float | ArrayLike) -> float | NDArray[np.float64]:
        """Largest true-positive rate of a (possibly randomised) threshold test whose
        false-positive rate is at most ``fpr`` (ROC convex hull; a point estimate, not a
        bound)."""
        f, scalar = check_rates("fpr", fpr)
        hx, hy = self._roc_hull()
        # On a vertical hull segment take its top: the last hull point at that FPR.
        keep = np.r_[hx[1:] != hx[:-1], True]
        out = np.interp(f, hx[keep], hy[keep])
        return float(out) if scalar else out
