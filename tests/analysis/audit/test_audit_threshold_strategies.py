"""Threshold-selection strategies: what each computes, and why the valid ones are valid."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    Bonferroni,
    ExplicitThreshold,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    RankGridBonferroni,
    audit_clopper_pearson,
    audit_gaussian_dp,
    audit_one_run,
    epsilon_bound_from_counts,
    error_curve,
)
from opacus_lastiterate.analysis.audit.clopper_pearson import clopper_pearson_upper


def scores(seed: int, n: int = 400, mu: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n)


def direct_pure_eps(
    fp: int, n_out: int, fn: int, n_in: int, delta: float, sig_per_rate: float
) -> float:
    a = 1.0 if fp == n_out else stats.beta.ppf(1 - sig_per_rate, fp + 1, n_out - fp)
    b = 1.0 if fn == n_in else stats.beta.ppf(1 - sig_per_rate, fn + 1, n_in - fn)
    vals = [0.0]
    if 1 - delta - a > 0:
        vals.append(math.log((1 - delta - a) / b))
    if 1 - delta - b > 0:
        vals.append(math.log((1 - delta - b) / a))
    return max(vals)


def test_error_curve_counts() -> None:
    ins, outs = np.array([1.0, 2.0, 3.0, 3.0]), np.array([0.0, 1.0, 2.5])
    curve = error_curve(ins, outs)
    np.testing.assert_array_equal(curve.thresholds, [0.0, 1.0, 2.0, 2.5, 3.0])
    for t, fp, fn in zip(curve.thresholds, curve.false_positives, curve.false_negatives):
        assert (fp, fn) == (np.sum(outs >= t), np.sum(ins < t))
    assert not curve.thresholds.flags.writeable


def test_explicit_threshold_equals_counts_level_bound() -> None:
    ins, outs = scores(0)
    t = 1.5
    fp, fn = int(np.sum(outs >= t)), int(np.sum(ins < t))
    res = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=ExplicitThreshold(t))
    assert res.epsilon == epsilon_bound_from_counts(fp, outs.size, fn, ins.size, delta=1e-5).epsilon
    assert res.threshold == t and res.is_bound


def test_bonferroni_over_observed_scores_is_max_at_divided_significance() -> None:
    ins, outs = scores(1, n=60)
    d, sig = 1e-5, 0.05
    n = ins.size + outs.size
    best = max(
        direct_pure_eps(
            int(np.sum(outs >= t)), outs.size, int(np.sum(ins < t)), ins.size, d, sig / n / 2
        )
        for t in np.concatenate([ins, outs])
    )
    res = audit_clopper_pearson(ins, outs, delta=d, threshold_strategy=Bonferroni())
    assert res.epsilon == pytest.approx(best, rel=1e-9)
    assert "Bonferroni over 120 candidate thresholds" in res.selection


def test_bonferroni_preset_candidates() -> None:
    ins, outs = scores(2, n=80)
    cands = (0.5, 1.0, 1.5, 2.0)
    best = max(
        direct_pure_eps(int(np.sum(outs >= t)), 80, int(np.sum(ins < t)), 80, 0.0, 0.05 / 4 / 2)
        for t in cands
    )
    res = audit_clopper_pearson(
        ins, outs, delta=0.0, threshold_strategy=Bonferroni(candidates=cands)
    )
    assert res.epsilon == pytest.approx(best, rel=1e-9)
    assert res.threshold in cands


def test_rank_grid_default_matches_direct_evaluation() -> None:
    ins, outs = scores(3, n=200)
    d, sig = 1e-5, 0.05
    grid = sorted({0} | {round(1.25**i) for i in range(40) if round(1.25**i) < 200})
    n_cand = 2 * len(grid)
    outs_desc, ins_asc = np.sort(outs)[::-1], np.sort(ins)
    per_rate = sig / n_cand / 2
    vals = []
    for (
        c
    ) in grid:  # "score > (c+1)-th largest out": FP = c; "score >= (c+1)-th smallest in": FN = c
        x = outs_desc[c]
        vals.append(direct_pure_eps(c, 200, int(np.sum(ins <= x)), 200, d, per_rate))
        y = ins_asc[c]
        vals.append(direct_pure_eps(int(np.sum(outs >= y)), 200, c, 200, d, per_rate))
    res = audit_clopper_pearson(ins, outs, delta=d)
    assert isinstance(res.threshold_strategy, RankGridBonferroni)
    assert res.epsilon == pytest.approx(max(vals), rel=1e-9)
    assert f"Bonferroni over {n_cand} candidate thresholds" in res.selection


@pytest.mark.parametrize("kind", ["rank-grid", "observed"])
def test_each_candidate_rate_bound_fails_at_most_at_its_level(kind: str) -> None:
    """The validity argument of the Bonferroni strategies, checked directly: at a threshold
    chosen from the data (a rank-grid point or an observed score), the Clopper-Pearson bound
    on the *true* rate fails with probability <= a. Continuous scores make it exactly a for
    thresholds at out-score ranks, so we also check the rate is not far below a (sharpness)."""
    from opacus_lastiterate.analysis.audit._selection import RateStatistic
    from opacus_lastiterate.analysis.audit.error_counts import counts_at

    a, n, reps, mu = 0.2, 40, 1500, 1.0
    rng = np.random.default_rng(11)
    fails = None
    for _ in range(reps):
        ins, outs = np.sort(rng.normal(mu, 1, n)), np.sort(rng.normal(0, 1, n))
        if kind == "rank-grid":
            cand = RateStatistic(lambda x, y: x).rank_candidates(ins, outs, 1.25)
            fp, fn = cand.fp_for_bound, cand.fn_for_bound
            t = cand.thresholds
        else:
            t = np.concatenate([outs, ins])
            fp, fn = counts_at(ins, outs, t)
        true_fpr = stats.norm.sf(t)  # Pr[out-score >= t]
        true_fnr = stats.norm.cdf(t - mu)  # Pr[in-score < t]
        f = (true_fpr > clopper_pearson_upper(fp, n, 1 - a)) | (
            true_fnr > clopper_pearson_upper(fn, n, 1 - a)
        )
        fails = f.astype(int) if fails is None else fails + f
    # Each candidate has two rate bounds: failure prob <= 2a. Binomial slack at 1e-4 per candidate.
    slack = stats.binom.ppf(1 - 1e-4, reps, 2 * a) / reps
    rates = fails / reps
    assert rates.max() <= slack
    assert rates.max() >= a  # not vacuous: the bound is attained up to noise


def test_naive_max_is_labelled_and_at_least_the_valid_bounds() -> None:
    ins, outs = scores(4)
    naive = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=NaiveMax())
    assert not naive.statistically_valid and not naive.is_bound
    assert naive.kind == "invalid" and str(naive).startswith("NOT A VALID BOUND")
    for s in (Bonferroni(), RankGridBonferroni()):
        assert (
            naive.epsilon
            >= audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=s).epsilon
        )


def test_held_out_split_chooses_on_one_part_and_bounds_on_the_other() -> None:
    ins, outs = scores(5, n=300)
    s = HeldOutSplit(selection_fraction=0.5, seed=7)
    res = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=s)
    # Reproduce: same permutations, best threshold on the selection part at level 0.05.
    rng = np.random.default_rng(7)
    pi, po = rng.permutation(300), rng.permutation(300)
    sel_in, ev_in = ins[pi[:150]], ins[pi[150:]]
    sel_out, ev_out = outs[po[:150]], outs[po[150:]]
    cand = np.unique(np.concatenate([sel_in, sel_out]))
    vals = [
        direct_pure_eps(int(np.sum(sel_out >= t)), 150, int(np.sum(sel_in < t)), 150, 1e-5, 0.025)
        for t in cand
    ]
    t = cand[int(np.argmax(vals))]
    fp, fn = int(np.sum(ev_out >= t)), int(np.sum(ev_in < t))
    assert res.threshold == t
    assert res.epsilon == pytest.approx(direct_pure_eps(fp, 150, fn, 150, 1e-5, 0.025), rel=1e-9)
    assert audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=s).epsilon == res.epsilon


def test_multi_split_reports_lower_median_of_half_level_splits() -> None:
    ins, outs = scores(6, n=200)
    ms = MultiSplit(num_splits=9, seed=3)
    res = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=ms)
    # The same 9 splits from the shared generator, each at half the significance.
    rng = np.random.default_rng(3)
    vals = []
    for _ in range(9):
        pi, po = rng.permutation(200), rng.permutation(200)
        sel_in, ev_in, sel_out, ev_out = (
            ins[pi[:100]],
            ins[pi[100:]],
            outs[po[:100]],
            outs[po[100:]],
        )
        cand = np.unique(np.concatenate([sel_in, sel_out]))
        sv = [
            direct_pure_eps(
                int(np.sum(sel_out >= t)), 100, int(np.sum(sel_in < t)), 100, 1e-5, 0.0125
            )
            for t in cand
        ]
        t = cand[int(np.argmax(sv))]
        vals.append(
            direct_pure_eps(
                int(np.sum(ev_out >= t)), 100, int(np.sum(ev_in < t)), 100, 1e-5, 0.0125
            )
        )
    assert res.epsilon == pytest.approx(sorted(vals)[4], rel=1e-9)  # ceil(9/2) = 5th smallest


@pytest.mark.parametrize(
    "strategy",
    [
        RankGridBonferroni(),
        Bonferroni(),
        HeldOutSplit(),
        MultiSplit(num_splits=5),
        ExplicitThreshold(1.0),
        NaiveMax(),
    ],
)
def test_every_strategy_runs_for_every_method(strategy) -> None:
    ins, outs = scores(7, n=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f in (audit_clopper_pearson, audit_gaussian_dp, audit_one_run):
            res = f(ins, outs, delta=1e-5, threshold_strategy=strategy)
            assert res.epsilon >= 0 and res.threshold_strategy is strategy
            assert res.statistically_valid == strategy.statistically_valid


def test_strategies_are_frozen_and_validated() -> None:
    s = HeldOutSplit()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"`selection_fraction` must be in \(0, 1\), got 1.0\."):
        HeldOutSplit(selection_fraction=1.0)
    with pytest.raises(ValueError, match=r"`num_splits` must be an integer >= 1, got 0\."):
        MultiSplit(num_splits=0)
    with pytest.raises(ValueError, match=r"`growth` must be in \(1, inf\), got 1.0\."):
        RankGridBonferroni(growth=1.0)
    with pytest.raises(ValueError, match="`candidates` must be non-empty"):
        Bonferroni(candidates=())
    with pytest.raises(TypeError, match="`threshold` must be a real number"):
        ExplicitThreshold("a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`threshold_strategy` must be a ThresholdStrategy"):
        audit_clopper_pearson([1.0], [0.0], delta=0.0, threshold_strategy="bonferroni")  # type: ignore[arg-type]
    assert hash(Bonferroni(candidates=[1.0, 2.0])) == hash(Bonferroni(candidates=(1.0, 2.0)))


def test_score_validation() -> None:
    with pytest.raises(ValueError, match="`in_scores` must be non-empty"):
        audit_clopper_pearson([], [0.0], delta=0.0)
    with pytest.raises(ValueError, match="`out_scores` must contain finite numbers only"):
        audit_clopper_pearson([1.0], [np.nan], delta=0.0)
    with pytest.raises(ValueError, match="`in_scores` must be one-dimensional"):
        audit_clopper_pearson(np.zeros((2, 2)), [0.0], delta=0.0)
    with pytest.raises(ValueError, match="a split strategy needs at least 2 in-scores"):
        audit_clopper_pearson([1.0], [0.0, 1.0], delta=0.0, threshold_strategy=HeldOutSplit())


def test_one_run_split_ignores_labels_so_held_out_inclusion_stays_random() -> None:
    """Splitting each side separately would fix the held-out in-count at (1 - f) n_in; the
    one-run theorem needs the held-out labels to be independent coins, so the split is pooled
    and the held-out in-count varies from seed to seed (hypergeometrically)."""
    import numpy as np

    from opacus_lastiterate.analysis.audit._selection import (
        OneRunStatistic,
        RateStatistic,
        choose_on_split,
    )

    ins, outs = np.arange(100.0) + 0.5, np.arange(100.0)
    one_run_counts, rate_counts = set(), set()
    for seed in range(20):
        _, _, ins_eval, _ = choose_on_split(
            OneRunStatistic(0.0), ins, outs, 0.5, np.random.default_rng(seed), 0.05
        )
        one_run_counts.add(ins_eval.size)
        _, _, ins_eval, _ = choose_on_split(
            RateStatistic(lambda a, b: a), ins, outs, 0.5, np.random.default_rng(seed), 0.05
        )
        rate_counts.add(ins_eval.size)
    assert rate_counts == {50}
    assert len(one_run_counts) > 3
