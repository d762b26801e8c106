"""The published protocols' presets: quick runs (CI) and the crafting objectives of their code."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.auditing import run_input_audit
from opacus_lastiterate.auditing.input_space.adversarial_samples import published_objective
from opacus_lastiterate.auditing.input_space.protocols import (
    annamalai_protocol,
    full_batch_noise_multiplier,
    run_protocol,
    yoon_protocol,
)


def test_noise_multiplier_gives_the_target_epsilon() -> None:
    sigma = full_batch_noise_multiplier(10.0, 1e-5, 100)
    assert gaussian_epsilon(mu=math.sqrt(100) / sigma, delta=1e-5) == pytest.approx(10.0, rel=1e-6)


def test_presets_follow_the_code() -> None:
    y, a = yoon_protocol(), annamalai_protocol()
    for p in (y, a):
        t = p.trainer
        assert (t.reduction, t.batch_size, t.steps) == ("sum", None, 100)
        assert t.canary.kind == "blank" and t.canary.label == 9
        assert t.learning_rate * t.num_examples == pytest.approx(4.0)
    assert y.trainer.initialisation == "random" and a.trainer.initialisation == "pretrained"
    assert set(y.objectives) >= {"subtract", "fisher", "bhattacharyya"}
    assert y.crafting_options["steps"] == 5 and y.crafting_options["bounds"] == (0.0, 1.0)
    assert a.crafting_runs == 0 and a.evaluation_runs == 100


@pytest.mark.parametrize("make", [yoon_protocol, annamalai_protocol])
def test_quick_preset_runs(make) -> None:  # type: ignore[no-untyped-def]
    out = run_protocol(make(quick=True), white_box=True)
    samples = out["samples"]
    assert "canary" in samples and "canary gradient (white-box)" in samples
    for v in samples.values():
        assert v["as published"]["kind"] == "invalid"
        assert v["as published"]["label"].startswith("as published: not a valid confidence bound")
        assert v["clopper-pearson"]["kind"] == "bound"
        assert v["gaussian-dp bonferroni"]["kind"] == "estimate"
        # the published maximum uses looser per-threshold bounds than the Bonferroni one
        assert v["as published"]["epsilon"] >= v["gaussian-dp bonferroni"]["epsilon"]
    if out["protocol"]["name"].startswith("yoon"):
        assert any("bhattacharyya" in k for k in samples)


def test_quick_yoon_preset_through_opacus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = yoon_protocol(quick=True)
    report = run_input_audit(
        p.trainer, p.trainer.canary, directory=tmp_path, evaluation_runs=6, crafting_runs=10,
        objectives=("subtract", "fisher"), crafting_options=p.crafting_options, delta=1e-5,
        workers=0, progress=False,
    )
    assert [a.name for a in report.audits] == ["canary", "subtract (white-box)", "fisher (white-box)"]


def test_published_objectives_match_their_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(7, generator=g), torch.rand(5, generator=g) + 0.5
    assert float(published_objective("subtract", a, b)) == pytest.approx(float((a[:5] - b).sum()))
    va, vb = float(a.var()), float(b.var())  # unbiased, as torch.std in their code
    assert va == pytest.approx(np_var(a.tolist()))
    ma, mb = float(a.mean()), float(b.mean())
    assert float(published_objective("fisher", a, b)) == pytest.approx(
        -((ma - mb) ** 2) / (va + vb + 1e-8), rel=1e-5)
    bhat = 0.25 * math.log(0.25 * (va / vb + vb / va + 2)) + 0.25 * (ma - mb) ** 2 / (va + vb)
    assert float(published_objective("bhattacharyya", a, b)) == pytest.approx(-bhat, rel=1e-5)
    with pytest.raises(ValueError, match="name"):
        published_objective("margin", a, b)


def np_var(x: list[float]) -> float:
    return float(stats.tvar(x))
