"""Planning: the best bound a budget can reach, against direct formulas and the audits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.audit import (
    Bonferroni,
    ExplicitThreshold,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    OneRunDeltaWarning,
    RankGridBonferroni,
    audit_clopper_pearson,
    audit_one_run,
    plan_multi_run_audit,
    plan_one_run_audit,
)
from opacus_lastiterate.analysis.audit.planning import canaries_needed


def perfect_cp_eps(n_out: int, n_in: int, delta: float, sig_per_rate: float) -> float:
    # Clopper-Pearson with 0 errors: UB = 1 - sig^(1/n); eps = max of the two branches.
    a = 1 - sig_per_rate ** (1 / n_out)
    b = 1 - sig_per_rate ** (1 / n_in)
    return max(math.log((1 - delta - a) / b), math.log((1 - delta - b) / a), 0.0)


@pytest.mark.parametrize("n,expected", [(50, 2.570), (100, 3.281), (500, 4.906), (1000, 5.601)])
def test_preset_threshold_plan_matches_anchor_table(n: int, expected: float) -> None:
    plan = plan_multi_run_audit(2 * n, delta=1e-5, threshold_strategy=ExplicitThreshold(0.0))
    assert plan.epsilon == pytest.approx(expected, abs=6e-4)  # docs/auditing.md, "Reference values"
    assert plan.epsilon == pytest.approx(perfect_cp_eps(n, n, 1e-5, 0.025), rel=1e-9)


@pytest.mark.parametrize("runs", [20, 101, 400, 3000])
@pytest.mark.parametrize("strategy", [RankGridBonferroni(), Bonferroni(), ExplicitThreshold(0.5)])
def test_multi_run_plan_equals_audit_of_perfectly_separated_scores(runs: int, strategy) -> None:
    n_out = runs // 2
    n_in = runs - n_out
    outs = -np.arange(n_out, dtype=float)  # all <= 0
    ins = 1.0 + np.arange(n_in, dtype=float)  # all >= 1: threshold 0.5 separates perfectly
    audit = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=strategy)
    plan = plan_multi_run_audit(runs, delta=1e-5, threshold_strategy=strategy)
    assert audit.counts.false_positives == 0 and audit.counts.false_negatives == 0
    assert plan.epsilon == pytest.approx(audit.epsilon, rel=1e-12)


def test_split_plans_use_the_held_out_part() -> None:
    plan = plan_multi_run_audit(
        400, delta=1e-5, threshold_strategy=HeldOutSplit(selection_fraction=0.25)
    )
    assert plan.epsilon == pytest.approx(perfect_cp_eps(150, 150, 1e-5, 0.025), rel=1e-9)
    plan = plan_multi_run_audit(400, delta=1e-5, threshold_strategy=MultiSplit())
    assert plan.epsilon == pytest.approx(perfect_cp_eps(100, 100, 1e-5, 0.0125), rel=1e-9)
    naive = plan_multi_run_audit(400, delta=1e-5, threshold_strategy=NaiveMax())
    assert not naive.statistically_valid and "NOT STATISTICALLY VALID" in str(naive)


def test_one_run_plan_with_preset_guesses_is_the_saturation_value() -> None:
    for r in (10, 100, 1000):
        a = 0.05
        x = a ** (1 / r)
        plan = plan_one_run_audit(2 * r, delta=0.0, num_guesses=r)
        assert plan.epsilon == pytest.approx(math.log(x / (1 - x)), abs=1e-8)
    # docs/auditing.md, "Reference values": m = r = 1000, delta = 1e-5 -> 5.7823.
    assert plan_one_run_audit(1000, delta=1e-5, num_guesses=1000).epsilon == pytest.approx(
        5.7823, abs=1e-4
    )


@pytest.mark.parametrize("m", [10, 101, 1000])
def test_one_run_plan_equals_audit_of_perfectly_separated_canaries(m: int) -> None:
    n_in = m // 2
    ins = 1.0 + np.arange(n_in, dtype=float)
    outs = -np.arange(m - n_in, dtype=float)
    audit = audit_one_run(ins, outs, delta=1e-6)
    plan = plan_one_run_audit(m, delta=1e-6)
    assert plan.epsilon == pytest.approx(audit.epsilon, rel=1e-12)


def test_canaries_needed_and_unreachable_targets() -> None:
    m = canaries_needed(3.0, delta=1e-6)
    assert plan_one_run_audit(m, delta=1e-6).epsilon >= 3.0
    assert plan_one_run_audit(m - 1, delta=1e-6).epsilon < 3.0
    with pytest.raises(ValueError, match="not reachable"):
        canaries_needed(30.0, delta=1e-3)


def test_plan_warns_and_prints() -> None:
    with pytest.warns(OneRunDeltaWarning):
        plan_one_run_audit(100_000, delta=1e-5, num_guesses=100)
    text = str(plan_multi_run_audit(1000, delta=1e-5))
    assert "1000 runs" in text and "perfect separation" in text and "epsilon >=" in text


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (
            lambda: plan_multi_run_audit(1, delta=1e-5),
            ValueError,
            r"`num_runs` must be an integer >= 2, got 1\.",
        ),
        (
            lambda: plan_multi_run_audit(100, delta=1.0),
            ValueError,
            r"`delta` must be in \[0, 1\), got 1.0\.",
        ),
        (
            lambda: plan_one_run_audit(100, delta=0.0, num_guesses=101),
            ValueError,
            r"`num_guesses` must be in \[1, 100\], got 101\.",
        ),
        (
            lambda: plan_multi_run_audit(100, delta=0.0, threshold_strategy=None),
            TypeError,
            "`threshold_strategy` must be",
        ),
    ],
)
def test_validation_messages(call, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        call()
