"""ScoreAudit: one object, scores validated and sorted once, every analysis a method."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    Bonferroni,
    ExplicitThreshold,
    NaiveMax,
    ScoreAudit,
    audit_clopper_pearson,
    audit_gaussian_dp,
    audit_one_run,
    error_curve,
)
from opacus_lastiterate.exceptions import NonRandomizedInclusionWarning


def scores(seed: int = 0, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(2.0, 1.0, n), rng.normal(0.0, 1.0, n)


def test_shortcuts_equal_methods_and_labels() -> None:
    ins, outs = scores()
    audit = ScoreAudit(ins, outs)
    assert audit.clopper_pearson(delta=1e-5) == audit_clopper_pearson(ins, outs, delta=1e-5)
    assert audit.gaussian_dp(delta=1e-5) == audit_gaussian_dp(ins, outs, delta=1e-5)
    assert audit.one_run(delta=1e-5) == audit_one_run(ins, outs, delta=1e-5)
    assert audit.clopper_pearson(delta=1e-5).kind == "bound"
    assert audit.gaussian_dp(delta=1e-5).kind == "estimate"
    assert audit.one_run(delta=1e-5).kind == "bound"
    assert audit.one_run_fdp(delta=1e-5).kind == "bound"
    assert audit.one_run_fdp(delta=1e-5, family="gaussian").kind == "estimate"
    for method in (audit.clopper_pearson, audit.gaussian_dp, audit.one_run, audit.one_run_fdp):
        res = method(delta=1e-5, threshold_strategy=NaiveMax())
        assert res.kind == "invalid" and str(res).startswith("NOT A VALID BOUND")


def test_sorted_once_read_only_and_order_independent() -> None:
    ins, outs = scores(1)
    audit = ScoreAudit(ins, outs)
    assert np.all(np.diff(audit.in_scores) >= 0) and audit.num_in == ins.size
    with pytest.raises(ValueError):
        audit.in_scores[0] = 1.0
    shuffled = ScoreAudit(ins[::-1], outs[::-1])
    assert shuffled.clopper_pearson(delta=1e-5) == audit.clopper_pearson(delta=1e-5)
    curve, ref = audit.error_curve(), error_curve(ins, outs)
    np.testing.assert_array_equal(curve.false_positives, ref.false_positives)
    np.testing.assert_array_equal(curve.thresholds, ref.thresholds)


def test_from_canaries_and_randomization_flag() -> None:
    rng = np.random.default_rng(2)
    coins = rng.random(500) < 0.5
    s = 2.0 * coins + rng.standard_normal(500)
    audit = ScoreAudit.from_canaries(s, coins)
    assert audit.num_in == coins.sum() and audit.num_out == (~coins).sum()
    assert audit.one_run(delta=0.0) == audit_one_run(s[coins], s[~coins], delta=0.0)
    fixed = ScoreAudit.from_canaries(s, coins, inclusion_randomized=False)
    with pytest.warns(NonRandomizedInclusionWarning):
        res = fixed.one_run_fdp(delta=0.0)
    assert res.kind == "invalid" and not res.is_bound
    with pytest.raises(TypeError, match="`included` must be a boolean array"):
        ScoreAudit.from_canaries(s, coins.astype(int))
    with pytest.raises(ValueError, match="`included` must have the shape"):
        ScoreAudit.from_canaries(s, coins[:-1])


def test_explicit_thresholds_may_be_infinite() -> None:
    ins, outs = scores(3)
    audit = ScoreAudit(ins, outs)
    nothing_in = audit.clopper_pearson(delta=0.0, threshold_strategy=ExplicitThreshold(math.inf))
    assert nothing_in.epsilon == 0.0 and nothing_in.counts.false_negatives == ins.size  # type: ignore[union-attr]
    everything_in = audit.one_run(delta=0.0, threshold_strategy=ExplicitThreshold(-math.inf))
    assert everything_in.counts.num_guesses == ins.size + outs.size  # type: ignore[union-attr]
    grid = [-math.inf, 0.0, 1.0, 2.0, math.inf]
    res = audit.clopper_pearson(delta=1e-5, threshold_strategy=Bonferroni(candidates=grid))
    assert res.threshold in grid and res.epsilon > 0 and "5 candidate" in res.selection
    with pytest.raises(ValueError, match="got nan"):
        Bonferroni(candidates=[0.0, math.nan])
    with pytest.raises(ValueError, match="got nan"):
        ExplicitThreshold(math.nan)


def test_auroc_is_mann_whitney_and_hull_is_larger() -> None:
    ins, outs = scores(4, n=200)
    ins = np.round(ins, 1)  # ties
    outs = np.round(outs, 1)
    audit = ScoreAudit(ins, outs)
    u = stats.mannwhitneyu(ins, outs, alternative="greater").statistic
    assert audit.auroc() == pytest.approx(u / (ins.size * outs.size), rel=1e-12)
    assert audit.auroc(convex_hull=True) >= audit.auroc()


def test_tpr_at_fpr_small_example() -> None:
    # ROC points (0,0) (0,.5) (.5,.5) (.5,1) (1,1); hull (0,0) (0,.5) (.5,1) (1,1).
    audit = ScoreAudit([1.0, 3.0], [0.0, 2.0])
    np.testing.assert_allclose(
        audit.tpr_at_fpr([0.0, 0.25, 0.5, 0.75, 1.0]), [0.5, 0.75, 1.0, 1.0, 1.0]
    )
    assert audit.tpr_at_fpr(0.25) == pytest.approx(0.75)
    worst = ScoreAudit(np.zeros(10), np.ones(10))
    np.testing.assert_allclose(worst.tpr_at_fpr([0.0, 0.3, 1.0]), [0.0, 0.3, 1.0])
    with pytest.raises(ValueError, match="`fpr` must"):
        audit.tpr_at_fpr(1.5)


def test_one_run_fdp_split_strategies_and_warnings() -> None:
    rng = np.random.default_rng(5)
    coins = rng.random(400) < 0.5
    audit = ScoreAudit.from_canaries(3.0 * coins + rng.standard_normal(400), coins)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = audit.one_run_fdp(delta=2e-4)  # 2 m delta = 0.16: no warning, delta is in f
    assert res.epsilon > 0
    with pytest.warns(Warning, match="2 \\* m \\* delta"):
        audit.one_run(delta=2e-4)
    from opacus_lastiterate.analysis.audit import HeldOutSplit, MultiSplit

    for strategy in (HeldOutSplit(seed=1), MultiSplit(num_splits=5, seed=1)):
        assert audit.one_run_fdp(delta=2e-4, threshold_strategy=strategy).kind == "bound"
