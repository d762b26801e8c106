"""Input-space audit protocol: crafting runs disjoint from evaluation runs, same runs and
statistics for every sample, resumable; with a cheap synthetic "training"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn

from opacus_lastiterate.auditing import AuditRunner, InputCanary, InputScore, run_input_audit
from opacus_lastiterate.auditing.input_space.audit import check_disjoint_runs
from opacus_lastiterate.auditing.input_space.model_cache import CachedTrain

CANARY = InputCanary(torch.tensor([0.0, 1.0, 0.0]), 1)


@dataclass(frozen=True)
class ToyTrain:
    """A 'training' whose final model is seeded noise, shifted along the canary when in."""

    shift: float = 3.0
    noise: float = 1.0

    def __call__(self, include_canary: bool, seed: int) -> nn.Module:
        g = torch.Generator().manual_seed(seed)
        model = nn.Linear(3, 2)
        with torch.no_grad():
            model.weight.copy_(self.noise * torch.randn(2, 3, generator=g))
            model.bias.zero_()
            if include_canary:
                model.weight[1, 1] += self.shift
        return model


def test_check_disjoint_runs() -> None:
    check_disjoint_runs([(1, True), (2, False)], [(3, True)])
    with pytest.raises(ValueError, match="share 1 training seed"):
        check_disjoint_runs([(1, True), (2, False)], [(2, True), (5, False)])
    a = AuditRunner(ToyTrain(), InputScore(CANARY), num_runs=20, seed=4, workers=0)
    with pytest.raises(ValueError, match="share 20"):
        check_disjoint_runs(a.assignments(), a.assignments())


def test_input_audit_protocol(tmp_path: Path) -> None:
    train, surrogate = ToyTrain(), ToyTrain(shift=2.0)
    kwargs = dict(
        directory=tmp_path, evaluation_runs=60, crafting_runs=30, surrogate_train=surrogate,
        surrogate_runs=30, delta=1e-5, workers=0, progress=False,
        crafting_options=dict(steps=20, learning_rate=0.1, bounds=(-1.0, 1.0)),
    )
    report = run_input_audit(train, CANARY, **kwargs)
    names = [a.name for a in report.audits]
    assert names == ["canary", "uniform (white-box)", "adaptive (white-box)",
                     "uniform (black-box)", "adaptive (black-box)"]
    assert report.crafting is not None and report.surrogate is not None
    evaluation = {r.seed for r in report.evaluation.records}
    crafting = {r.seed for r in report.crafting.records}
    surrogates = {r.seed for r in report.surrogate.records}
    assert len(evaluation) == 60 and len(crafting) == 30 and len(surrogates) == 30
    assert not evaluation & crafting and not evaluation & surrogates  # disjoint runs
    # the models on disk: evaluation and crafting models of `train`, surrogates apart
    cache = CachedTrain(train, str(tmp_path / "models"))
    on_disk = {int(p.stem.split("-")[1]) for p in cache.folder.glob("*.pt")}
    assert on_disk == evaluation | crafting
    # every sample scored on the same runs (same seeds and coins), audited alike
    runs = [(r.index, r.seed, r.include_canary) for r in report.evaluation.records]
    models = {(inc, seed): train(inc, seed) for _, seed, inc in runs}
    for a in report.audits:
        assert a.records is not None
        assert [(r.index, r.seed, r.include_canary) for r in a.records.records] == runs
        assert a.bound.kind == "bound" and a.estimate.kind == "estimate"
        assert a.bound.confidence == 0.95 and a.bound.delta == 1e-5
        # the scores are the sample's scores on the evaluation models (independent rescoring)
        score = InputScore(a.sample)
        rescored = [score(models[r.include_canary, r.seed]) for r in a.records.records]
        np.testing.assert_allclose(rescored, [r.score for r in a.records.records], rtol=1e-6)
        # the AUROC is that of the rescored runs (scikit-learn; "in" the positive class)
        labels = [r.include_canary for r in a.records.records]
        assert a.auroc == pytest.approx(roc_auc_score(labels, rescored), abs=1e-12)
    # the canary separates (shift 3 on a noise-1 weight): a positive bound
    assert report.audit("canary").bound.epsilon > 0.0
    assert report.as_dict()["evaluation_runs"] == {"in": report.num_in, "out": report.num_out}
    # resumed from the directory: nothing retrained, same result
    again = run_input_audit(train, CANARY, **kwargs)
    assert [a.bound.epsilon for a in again.audits] == [a.bound.epsilon for a in report.audits]


def test_input_audit_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="surrogate_train"):
        run_input_audit(ToyTrain(), CANARY, directory=tmp_path, evaluation_runs=4,
                        surrogate_runs=4, delta=1e-5, workers=0)
    with pytest.raises(ValueError, match="crafting_runs"):
        run_input_audit(ToyTrain(), CANARY, directory=tmp_path, evaluation_runs=4,
                        crafting_runs=1, delta=1e-5, workers=0)
    with pytest.raises(ValueError, match="objectives"):
        run_input_audit(ToyTrain(), CANARY, directory=tmp_path, evaluation_runs=4,
                        objectives=("nope",), delta=1e-5, workers=0)


def test_cached_train(tmp_path: Path) -> None:
    cache = CachedTrain(ToyTrain(), str(tmp_path))
    first = cache(True, 7)
    assert cache.path(True, 7).exists() and not cache.path(False, 7).exists()
    again = cache(True, 7)
    torch.testing.assert_close(first.weight, again.weight)
    assert CachedTrain(ToyTrain(shift=1.0), str(tmp_path)).folder != cache.folder
    with pytest.raises(FileNotFoundError):
        cache.load(False, 7)
    with pytest.raises(TypeError, match="include_canary"):
        cache.path(1, 7)  # type: ignore[arg-type]
    np.testing.assert_array_equal(  # a cached model is the trained one, not a retrained one
        cache.load(True, 7).weight.detach().numpy(), first.weight.detach().numpy()
    )


@pytest.mark.slow
def test_opacus_digits_input_audit_reaches_a_positive_bound(tmp_path: Path) -> None:
    """Real Opacus training with a strong (blank, least-likely label) canary from a
    worst-case initialisation at small noise: the canary's bound must be positive and every
    bound below the standard epsilon (a proven upper bound)."""
    from opacus_lastiterate.auditing import (
        OpacusInputTrainer,
        blank_canary,
        least_likely_label,
    )

    probe = OpacusInputTrainer(canary=blank_canary((64,), 0), hidden=8, num_examples=60,
                               steps=10, noise_multiplier=0.5, init_examples=200,
                               init_steps=100, initialisation="worst-case")
    label = least_likely_label(probe.random_initial_model(), torch.zeros(64))
    canary = blank_canary((64,), label)
    trainer = OpacusInputTrainer(canary=canary, hidden=8, num_examples=60, steps=10,
                                 noise_multiplier=0.5, init_examples=200, init_steps=100,
                                 initialisation="worst-case")
    report = run_input_audit(trainer, canary, directory=tmp_path, evaluation_runs=80,
                             crafting_runs=24, delta=1e-5, workers=0, progress=False,
                             crafting_options=dict(steps=20, bounds=(0.0, 1.0)))
    standard = trainer.standard_epsilon(1e-5)
    assert report.audit("canary").bound.epsilon > 0.5
    assert all(0.0 <= a.bound.epsilon <= standard for a in report.audits)
