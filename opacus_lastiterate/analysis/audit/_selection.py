"""Apply a threshold strategy to a per-threshold statistic (package-internal).

A *statistic* maps the scores and a significance level to a number at one threshold (an
epsilon lower bound, or a mu lower bound) and can maximise it over candidate thresholds.
The strategies of ``threshold_strategies.py`` decide which thresholds and which
significance (see that module for why each is valid).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.special import betaincinv, expit
from scipy.stats import binom

from opacus_lastiterate.analysis.audit.clopper_pearson import upper_at_significance
from opacus_lastiterate.analysis.audit.error_counts import counts_at
from opacus_lastiterate.analysis.audit.one_run import epsilon_search
from opacus_lastiterate.analysis.audit.result import AuditCounts, MultiRunCounts, OneRunCounts
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    Bonferroni,
    ExplicitThreshold,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    RankGridBonferroni,
    ThresholdStrategy,
    rank_grid,
)

Array = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Candidates:
    """Thresholds to try; optional counts to feed the bound instead of the observed ones
    (rank-grid thresholds use their rank, which is what the validity argument covers)."""

    thresholds: Array
    fp_for_bound: IntArray | None = None
    fn_for_bound: IntArray | None = None


class Statistic(Protocol):
    def best(
        self, ins: Array, outs: Array, significance: float, cand: Candidates
    ) -> tuple[float, int]:
        """(max value, index of a maximising candidate); ``ins``/``outs`` sorted."""

    def at(self, ins: Array, outs: Array, significance: float, threshold: float) -> float:
        """The value at one threshold."""

    def rank_candidates(self, ins: Array, outs: Array, growth: float) -> Candidates:
        """The rank-grid candidates of :class:`RankGridBonferroni`."""

    def counts(self, ins: Array, outs: Array, threshold: float) -> AuditCounts:
        """The counts of the test at ``threshold``."""


def _cp_upper(k: IntArray, n: int, significance: float) -> Array:
    """Clopper-Pearson upper bounds, each distinct count evaluated once."""
    uniq, inverse = np.unique(k, return_inverse=True)
    return upper_at_significance(uniq, n, significance)[inverse.reshape(k.shape)]


class RateStatistic:
    """f(FPR_ub, FNR_ub), both bounds at significance / 2 (union bound over the two rates)."""

    def __init__(self, objective: Callable[[Array, Array], Array]) -> None:
        self._objective = objective

    def _values(
        self, fp: IntArray, fn: IntArray, n_out: int, n_in: int, significance: float
    ) -> Array:
        a = _cp_upper(fp, n_out, 0.5 * significance)
        b = _cp_upper(fn, n_in, 0.5 * significance)
        return self._objective(a, b)

    def best(
        self, ins: Array, outs: Array, significance: float, cand: Candidates
    ) -> tuple[float, int]:
        fp, fn = counts_at(ins, outs, cand.thresholds)
        if cand.fp_for_bound is not None:
            fp = cand.fp_for_bound
        if cand.fn_for_bound is not None:
            fn = cand.fn_for_bound
        vals = self._values(fp, fn, outs.size, ins.size, significance)
        i = int(np.argmax(vals))
        return float(vals[i]), i

    def at(self, ins: Array, outs: Array, significance: float, threshold: float) -> float:
        fp, fn = counts_at(ins, outs, np.array([threshold]))
        return float(self._values(fp, fn, outs.size, ins.size, significance)[0])

    def rank_candidates(self, ins: Array, outs: Array, growth: float) -> Candidates:
        out_ranks = np.array(rank_grid(outs.size, growth, include_zero=True), dtype=np.int64)
        in_ranks = np.array(rank_grid(ins.size, growth, include_zero=True), dtype=np.int64)
        outs_desc = outs[::-1]
        # "score > (c+1)-th largest out-score" == "score >= the next double above it".
        t_out = np.nextafter(outs_desc[out_ranks], np.inf)
        t_in = ins[in_ranks]  # "score >= (c+1)-th smallest in-score": c false negatives
        thresholds = np.concatenate([t_out, t_in])
        fp_obs, fn_obs = counts_at(ins, outs, thresholds)
        fp = np.concatenate([out_ranks, fp_obs[out_ranks.size :]])
        fn = np.concatenate([fn_obs[: out_ranks.size], in_ranks])
        return Candidates(thresholds, fp, fn)

    def counts(self, ins: Array, outs: Array, threshold: float) -> MultiRunCounts:
        fp, fn = counts_at(ins, outs, np.array([threshold]))
        return MultiRunCounts(ins.size, outs.size, int(fp[0]), int(fn[0]))


class OneRunStatistic:
    """One-run epsilon bound of the test "guess in iff score >= t" (no "out" guesses)."""

    def __init__(self, delta: float) -> None:
        self._delta = delta

    @staticmethod
    def _guesses(ins: Array, outs: Array, thresholds: Array) -> tuple[IntArray, IntArray]:
        fp, fn = counts_at(ins, outs, thresholds)
        correct = ins.size - fn
        return correct + fp, correct

    def at(self, ins: Array, outs: Array, significance: float, threshold: float) -> float:
        r, v = self._guesses(ins, outs, np.array([threshold]))
        return epsilon_search(ins.size + outs.size, int(r[0]), int(v[0]), significance, self._delta)

    def best(
        self, ins: Array, outs: Array, significance: float, cand: Candidates
    ) -> tuple[float, int]:
        """Exact maximum, pruned: a candidate whose delta = 0 p-value at the current best eps
        is already >= significance cannot beat it (the p-value grows with eps and delta)."""
        m = ins.size + outs.size
        r, v = self._guesses(ins, outs, cand.thresholds)
        # Visit likely winners first: decreasing Clopper-Pearson lower bound on v / r.
        precision_lb = np.zeros(r.shape)
        ok = (r > 0) & (v > 0)
        precision_lb[ok] = betaincinv(
            v[ok].astype(float), (r[ok] - v[ok] + 1).astype(float), significance
        )
        remaining = np.argsort(-precision_lb, kind="stable")
        best_eps, best_idx = 0.0, int(remaining[0])
        remaining = remaining[v[remaining] > 0]

        def prune(idx: NDArray[np.intp], eps: float) -> NDArray[np.intp]:
            if idx.size == 0:
                return idx
            return idx[binom.sf(v[idx] - 1, r[idx], expit(eps)) < significance]

        remaining = prune(remaining, best_eps)
        while remaining.size:
            i = int(remaining[0])
            remaining = remaining[1:]
            eps = epsilon_search(m, int(r[i]), int(v[i]), significance, self._delta, floor=best_eps)
            if eps > best_eps:
                best_eps, best_idx = eps, i
                remaining = prune(remaining, best_eps)
        return best_eps, best_idx

    def rank_candidates(self, ins: Array, outs: Array, growth: float) -> Candidates:
        pooled_desc = np.sort(np.concatenate([ins, outs]))[::-1]
        ks = np.array(rank_grid(pooled_desc.size, growth, include_zero=False), dtype=np.int64)
        return Candidates(pooled_desc[ks - 1])  # guess "in" for the top k (>= k with ties)

    def counts(self, ins: Array, outs: Array, threshold: float) -> OneRunCounts:
        r, v = self._guesses(ins, outs, np.array([threshold]))
        return OneRunCounts(ins.size + outs.size, int(r[0]), int(v[0]))


@dataclass(frozen=True)
class Selected:
    value: float
    threshold: float
    counts: AuditCounts
    selection: str


def _observed(ins: Array, outs: Array) -> Candidates:
    return Candidates(np.unique(np.concatenate([ins, outs])))


def _best(
    stat: Statistic, ins: Array, outs: Array, significance: float, cand: Candidates
) -> tuple[float, float]:
    value, i = stat.best(ins, outs, significance, cand)
    return value, float(cand.thresholds[i])


def _split(
    ins: Array, outs: Array, fraction: float, rng: np.random.Generator, *, pooled: bool = False
) -> tuple[Array, Array, Array, Array]:
    """Selection / evaluation split. ``pooled`` (one-run audits) permutes all canaries
    together regardless of label, so that the held-out canaries' inclusion stays a set of
    independent fair coins, as the one-run theorem requires; otherwise each side is split."""
    if pooled:
        scores = np.concatenate([ins, outs])
        is_in = np.r_[np.ones(ins.size, bool), np.zeros(outs.size, bool)]
        if scores.size < 2:
            raise ValueError(f"a split strategy needs at least 2 canaries, got {scores.size}.")
        k = min(max(round(fraction * scores.size), 1), scores.size - 1)
        perm = rng.permutation(scores.size)
        sel, ev = perm[:k], perm[k:]
        return (
            np.sort(scores[sel][is_in[sel]]),
            np.sort(scores[sel][~is_in[sel]]),
            np.sort(scores[ev][is_in[ev]]),
            np.sort(scores[ev][~is_in[ev]]),
        )

    def one(x: Array, name: str) -> tuple[Array, Array]:
        if x.size < 2:
            raise ValueError(f"a split strategy needs at least 2 {name}, got {x.size}.")
        k = min(max(round(fraction * x.size), 1), x.size - 1)
        perm = rng.permutation(x.size)
        return np.sort(x[perm[:k]]), np.sort(x[perm[k:]])

    ins_sel, ins_eval = one(ins, "in-scores")
    outs_sel, outs_eval = one(outs, "out-scores")
    return ins_sel, outs_sel, ins_eval, outs_eval


def _choose_on_split(
    stat: Statistic,
    ins: Array,
    outs: Array,
    fraction: float,
    rng: np.random.Generator,
    significance: float,
) -> tuple[float, float, Array, Array]:
    pooled = isinstance(stat, OneRunStatistic)
    ins_sel, outs_sel, ins_eval, outs_eval = _split(ins, outs, fraction, rng, pooled=pooled)
    _, t = _best(stat, ins_sel, outs_sel, significance, _observed(ins_sel, outs_sel))
    return stat.at(ins_eval, outs_eval, significance, t), t, ins_eval, outs_eval


def select(
    strategy: ThresholdStrategy, stat: Statistic, ins: Array, outs: Array, significance: float
) -> Selected:
    """Run ``strategy``; the returned value holds with probability >= 1 - significance
    (except for :class:`NaiveMax`). Splits permute the scores in the order given."""
    raw_ins, raw_outs = ins, outs
    ins = np.sort(ins)
    outs = np.sort(outs)
    if isinstance(strategy, ExplicitThreshold):
        t = float(strategy.threshold)
        value = stat.at(ins, outs, significance, t)
        return Selected(value, t, stat.counts(ins, outs, t), strategy.describe())
    if isinstance(strategy, RankGridBonferroni):
        cand = stat.rank_candidates(ins, outs, strategy.growth)
        n = cand.thresholds.size
        value, t = _best(stat, ins, outs, significance / n, cand)
        text = (
            f"Bonferroni over {n} candidate thresholds at a geometric rank grid "
            f"(growth {strategy.growth:g}), each at significance {significance / n:.3g}"
        )
        return Selected(value, t, stat.counts(ins, outs, t), text)
    if isinstance(strategy, Bonferroni):
        if strategy.candidates is not None:
            cand = Candidates(np.unique(np.asarray(strategy.candidates, dtype=np.float64)))
            n, what = len(strategy.candidates), "pre-set"
        else:
            cand = _observed(ins, outs)
            n, what = ins.size + outs.size, "every observed score"
        value, t = _best(stat, ins, outs, significance / n, cand)
        text = f"Bonferroni over {n} candidate thresholds ({what}), each at significance {significance / n:.3g}"
        return Selected(value, t, stat.counts(ins, outs, t), text)
    if isinstance(strategy, NaiveMax):
        value, t = _best(stat, ins, outs, significance, _observed(ins, outs))
        return Selected(value, t, stat.counts(ins, outs, t), strategy.describe())
    if isinstance(strategy, HeldOutSplit):
        rng = np.random.default_rng(strategy.seed)
        value, t, ins_eval, outs_eval = _choose_on_split(
            stat, raw_ins, raw_outs, strategy.selection_fraction, rng, significance
        )
        text = (
            f"threshold chosen on a held-out {strategy.selection_fraction:g} split "
            f"(seed {strategy.seed}), bound on the other {ins_eval.size} + {outs_eval.size} scores"
        )
        return Selected(value, t, stat.counts(ins_eval, outs_eval, t), text)
    if isinstance(strategy, MultiSplit):
        rng = np.random.default_rng(strategy.seed)
        half = 0.5 * significance
        results = [
            _choose_on_split(stat, raw_ins, raw_outs, strategy.selection_fraction, rng, half)
            for _ in range(strategy.num_splits)
        ]
        order = sorted(range(len(results)), key=lambda j: results[j][0])
        value, t, ins_eval, outs_eval = results[order[math.ceil(len(results) / 2) - 1]]
        text = (
            f"lower median of {strategy.num_splits} held-out splits "
            f"(choose on {strategy.selection_fraction:g}, seed {strategy.seed}), "
            f"each at significance {half:.3g}"
        )
        return Selected(value, t, stat.counts(ins_eval, outs_eval, t), text)
    raise TypeError(f"`threshold_strategy` must be a ThresholdStrategy, got {strategy!r}.")
