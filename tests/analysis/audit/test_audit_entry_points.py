"""One audit surface: every shortcut that turns scores into an AuditResult gives exactly what
the corresponding ScoreAudit method gives (same object fields, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.audit import (
    HeldOutSplit,
    NaiveMax,
    RankGridBonferroni,
    ScoreAudit,
    audit_clopper_pearson,
    audit_gaussian_dp,
    audit_one_run,
)

STRATEGIES = [RankGridBonferroni(), NaiveMax(), HeldOutSplit(seed=3)]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
def test_the_shortcuts_are_one_call_on_score_audit(strategy: object) -> None:
    rng = np.random.default_rng(0)
    ins, outs = rng.normal(1.5, 1.0, 300), rng.normal(0.0, 1.0, 280)
    kw = {"delta": 1e-5, "confidence": 0.9, "threshold_strategy": strategy}
    audit = ScoreAudit(ins, outs)
    assert audit_clopper_pearson(ins, outs, **kw) == audit.clopper_pearson(**kw)  # type: ignore[arg-type]
    assert audit_gaussian_dp(ins, outs, **kw) == audit.gaussian_dp(**kw)  # type: ignore[arg-type]
    one_run = ScoreAudit(ins, outs, inclusion_randomized=True).one_run(**kw)  # type: ignore[arg-type]
    assert audit_one_run(ins, outs, **kw) == one_run  # type: ignore[arg-type]
    fixed = ScoreAudit(ins, outs, inclusion_randomized=False)
    with pytest.warns(Warning):
        expected = fixed.one_run(**kw)  # type: ignore[arg-type]
    with pytest.warns(Warning):
        assert audit_one_run(ins, outs, inclusion_randomized=False, **kw) == expected  # type: ignore[arg-type]
