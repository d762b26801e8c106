"""Per-threshold statistics and the helpers the threshold strategies use (package-internal).

A *statistic* maps the (sorted) scores and a significance level to a number at one
threshold (an epsilon lower bound, or a mu lower bound) and can maximise it over candidate
thresholds. Each strategy of ``threshold_strategies.py`` decides which thresholds and which
significance in its ``select`` method (see that module for why each is valid).
"""

from __future__ import annotations

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
from opacus_lastiterate.analysis.audit.one_run_fdp import TradeOffFamily, parameter_search
from opacus_lastiterate.analysis.audit.result import AuditCounts, MultiRunCounts, OneRunCounts

Array = NDArray[np.float64]
IntArray = NDArray[np.int64]


def rank_grid(n: int, growth: float, *, include_zero: bool) -> list[int]:
    """``{0} U {round(growth**i) : i >= 0}`` below ``n`` (without 0 if not ``include_zero``)."""
    values = {0} if include_zero else set()
    x = 1.0
    while round(x) < n:
        values.add(round(x))
        x *= growth
    return sorted(values)


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


class FdpOneRunStatistic(OneRunStatistic):
    """f-DP one-run value (mu or epsilon, ``one_run_fdp.py``) of "guess in iff score >= t"."""

    def __init__(self, delta: float, family: TradeOffFamily) -> None:
        super().__init__(delta)
        self._family = family

    def at(self, ins: Array, outs: Array, significance: float, threshold: float) -> float:
        r, v = self._guesses(ins, outs, np.array([threshold]))
        m = ins.size + outs.size
        return parameter_search(m, int(r[0]), int(v[0]), significance, self._family, self._delta)

    def best(
        self, ins: Array, outs: Array, significance: float, cand: Candidates
    ) -> tuple[float, int]:
        """Exact maximum: candidates in decreasing precision order, each searched from the
        best value so far (one recursion when it cannot beat it, the claim family being nested)."""
        m = ins.size + outs.size
        r, v = self._guesses(ins, outs, cand.thresholds)
        precision = np.where(r > 0, v / np.maximum(r, 1), 0.0)
        order = np.argsort(-precision, kind="stable")
        best_val, best_idx = 0.0, int(order[0])
        for i in order[v[order] > 0]:
            val = parameter_search(
                m, int(r[i]), int(v[i]), significance, self._family, self._delta, best_val
            )
            if val > best_val:
                best_val, best_idx = val, int(i)
        return best_val, best_idx


@dataclass(frozen=True)
class Scores:
    """Validated scores: sorted copies for the statistics, the given order for the splits."""

    ins: Array
    outs: Array
    raw_ins: Array
    raw_outs: Array

    @classmethod
    def of(cls, raw_ins: Array, raw_outs: Array) -> Scores:
        ins, outs = np.sort(raw_ins), np.sort(raw_outs)
        for a in (ins, outs, raw_ins, raw_outs):
            a.flags.writeable = False
        return cls(ins, outs, raw_ins, raw_outs)


@dataclass(frozen=True)
class Selected:
    value: float
    threshold: float
    counts: AuditCounts
    selection: str


def observed(ins: Array, outs: Array) -> Candidates:
    return Candidates(np.unique(np.concatenate([ins, outs])))


def best(
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


def choose_on_split(
    stat: Statistic,
    ins: Array,
    outs: Array,
    fraction: float,
    rng: np.random.Generator,
    significance: float,
) -> tuple[float, float, Array, Array]:
    pooled = isinstance(stat, OneRunStatistic)
    ins_sel, outs_sel, ins_eval, outs_eval = _split(ins, outs, fraction, rng, pooled=pooled)
    _, t = best(stat, ins_sel, outs_sel, significance, observed(ins_sel, outs_sel))
    return stat.at(ins_eval, outs_eval, significance, t), t, ins_eval, outs_eval
