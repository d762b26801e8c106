"""The result object: immutable, labelled, readable."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opacus_lastiterate.analysis.audit import (
    AuditResult,
    NaiveMax,
    RankGridBonferroni,
    audit_clopper_pearson,
    audit_gaussian_dp,
)
from opacus_lastiterate.analysis.audit.result import (
    AUDIT_RESULT_FIELDS,
    MultiRunCounts,
    OneRunCounts,
)


def test_result_is_frozen_and_carries_everything() -> None:
    rng = np.random.default_rng(0)
    res = audit_clopper_pearson(
        rng.normal(3, 1, 200), rng.normal(0, 1, 200), delta=1e-5, confidence=0.9
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.epsilon = 10.0  # type: ignore[misc]
    assert res.delta == 1e-5 and res.confidence == 0.9
    assert res.method == "clopper-pearson" and res.kind == "bound" and res.is_bound
    assert isinstance(res.counts, MultiRunCounts) and res.counts.num_in == 200
    assert isinstance(res.threshold_strategy, RankGridBonferroni)
    text = str(res)
    for piece in (
        "epsilon >=",
        "delta = 1e-05",
        "90% confidence",
        "lower bound",
        "clopper-pearson",
        "FP ",
        "Bonferroni",
    ):
        assert piece in text


def test_estimate_and_invalid_results_say_so() -> None:
    rng = np.random.default_rng(1)
    ins, outs = rng.normal(3, 1, 200), rng.normal(0, 1, 200)
    gdp = audit_gaussian_dp(ins, outs, delta=1e-5)
    assert gdp.kind == "estimate" and not gdp.is_bound and gdp.mu is not None and gdp.mu > 0
    assert str(gdp).startswith("NOT A VALID BOUND (estimate") and "ESTIMATE" in str(gdp)
    naive = audit_clopper_pearson(ins, outs, delta=1e-5, threshold_strategy=NaiveMax())
    assert naive.kind == "invalid" and not naive.is_bound and naive.notes
    assert str(naive).startswith("NOT A VALID BOUND (statistically invalid")
    naive_gdp = audit_gaussian_dp(ins, outs, delta=1e-5, threshold_strategy=NaiveMax())
    assert naive_gdp.kind == "invalid" and str(naive_gdp).startswith("NOT A VALID BOUND")


def test_invalid_results_are_never_kind_bound() -> None:
    counts = OneRunCounts(10, 5, 5)
    for kind in ("bound", "estimate"):
        with pytest.raises(ValueError, match="`kind` must be 'invalid' exactly when"):
            AuditResult(1.0, 1e-5, 0.95, "one-run", kind, counts, statistically_valid=False)
    with pytest.raises(ValueError, match="`kind` must be 'invalid' exactly when"):
        AuditResult(1.0, 1e-5, 0.95, "one-run", "invalid", counts)


def test_result_validation() -> None:
    counts = OneRunCounts(10, 5, 5)
    with pytest.raises(ValueError, match="`kind` must be one of"):
        AuditResult(1.0, 1e-5, 0.95, "one-run", "guess", counts)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`confidence` must be in \(0, 1\), got 1.0\."):
        AuditResult(1.0, 1e-5, 1.0, "one-run", "bound", counts)
    with pytest.raises(ValueError, match="`epsilon` must be >= 0"):
        AuditResult(-1.0, 1e-5, 0.95, "one-run", "bound", counts)
    with pytest.raises(ValueError, match=r"`num_correct` must be in \[0, 5\], got 6\."):
        OneRunCounts(10, 5, 6)
    with pytest.raises(ValueError, match=r"`false_negatives` must be in \[0, 3\], got 4\."):
        MultiRunCounts(3, 3, 0, 4)
    assert str(AuditResult(float("inf"), 0.0, 0.95, "one-run", "bound", counts)).startswith(
        "epsilon >= inf"
    )


def test_as_dict_writes_every_field_and_the_counts() -> None:
    counts = MultiRunCounts(num_in=10, num_out=12, false_positives=1, false_negatives=2)
    result = AuditResult(
        epsilon=0.75, delta=1e-5, confidence=0.95, method="clopper-pearson", kind="bound",
        counts=counts, threshold=0.5, selection="chosen", notes=("a", "b"),
    )
    assert result.as_dict() == {
        "epsilon": 0.75, "delta": 1e-5, "confidence": 0.95, "method": "clopper-pearson",
        "kind": "bound", "statistically_valid": True,
        "counts": {"num_in": 10, "num_out": 12, "false_positives": 1, "false_negatives": 2},
        "threshold": 0.5, "selection": "chosen", "mu": None, "notes": ["a", "b"],
        "summary": str(result),
    }
    assert list(result.as_dict()) == list(AUDIT_RESULT_FIELDS)


def test_as_dict_selects_fields_in_order_and_flattens_counts() -> None:
    one_run = AuditResult(
        epsilon=1.5, delta=0.0, confidence=0.95, method="one-run", kind="bound",
        counts=OneRunCounts(num_canaries=20, num_guesses=6, num_correct=5),
    )
    fields = ("kind", "num_correct", "num_guesses", "num_in", "epsilon")
    assert one_run.as_dict(fields) == {
        "kind": "bound", "num_correct": 5, "num_guesses": 6, "num_in": None, "epsilon": 1.5,
    }
    assert list(one_run.as_dict(fields)) == list(fields)
    # no strategy and no selection: the selection is empty
    assert one_run.as_dict(("selection",)) == {"selection": ""}
    with pytest.raises(ValueError, match="`fields`"):
        one_run.as_dict(("epsilon", "nonsense"))
    with pytest.raises(TypeError, match="`fields`"):
        one_run.as_dict("epsilon")  # type: ignore[arg-type]


def test_as_dict_selection_falls_back_to_the_strategy_description() -> None:
    strategy = NaiveMax()
    result = AuditResult(
        epsilon=0.5, delta=1e-5, confidence=0.95, method="clopper-pearson", kind="invalid",
        counts=MultiRunCounts(num_in=4, num_out=4, false_positives=0, false_negatives=1),
        threshold_strategy=strategy, statistically_valid=False,
    )
    assert result.as_dict(("selection",)) == {"selection": strategy.describe()}
