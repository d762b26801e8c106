"""Text canaries in the in-training audit: a plain Opacus loop on a bigram model, reported as
``"text"`` canaries beside the heuristic and standard epsilons."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.auditing.input_space import make_text_canaries
from opacus_lastiterate.callbacks import InTrainingCanaryAudit
from tests.auditing.input_space.test_text_canaries import L, Progressions, V

DELTA = 1e-5


def test_text_canaries_end_to_end_report() -> None:
    data, canaries = make_text_canaries(Progressions(100, 0), 80, vocab_size=V, length=L, seed=0)
    torch.manual_seed(0)
    model = nn.Embedding(V, V)
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=20.0),
            data_loader=DataLoader(data, batch_size=40),
            noise_multiplier=0.5,
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
        audit = InTrainingCanaryAudit(
            optimizer,
            num_canaries=0,  # text canaries only; the accountant gives the reference epsilons
            sample_rate=1 / len(loader),
            seed=0,
            accountant=engine.accountant,
            input_canaries=canaries,
        )
        for _ in range(8):
            for x in loader:
                if len(x) == 0:
                    continue
                optimizer.zero_grad()
                logits = private(x[:, :-1])
                nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1)).backward()
                optimizer.step()
    with pytest.raises(ValueError, match="`model`"):
        audit.report(delta=DELTA)
    with pytest.raises(ValueError, match="`input_loss`"):
        audit.report(delta=DELTA, model=model, input_loss=nn.functional.cross_entropy)
    report = audit.report(delta=DELTA, model=model, standard=False)
    assert [a.canaries for a in report.audits] == ["text"]
    text = report.audit("text")
    assert text.num_canaries == 80 and text.num_included == int(canaries.included.sum())
    expected = ScoreAudit.from_canaries(canaries.scores(model), canaries.included)
    assert text.one_run.epsilon == expected.one_run(delta=DELTA).epsilon
    assert text.one_run_fdp.epsilon == expected.one_run_fdp(delta=DELTA).epsilon
    assert text.one_run.is_bound and text.one_run.epsilon > 0.0  # memorised: a signal
    assert report.heuristic_epsilon is not None and report.steps is None
    scores = canaries.scores(model)
    assert scores[canaries.included].mean() > scores[~canaries.included].mean()
    printed = str(report)
    assert f"text canaries: 80 ({text.num_included} included by fair coins)" in printed
    assert "one-run       epsilon >=" in printed
    assert json.loads(json.dumps(report.as_dict()))["audits"][0]["canaries"] == "text"


def test_other_objects_are_refused_as_input_canaries() -> None:
    model = nn.Linear(2, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, optimizer, _ = PrivacyEngine().make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader([(torch.zeros(2), torch.zeros(1))] * 4, batch_size=2),
            noise_multiplier=1.0,
            max_grad_norm=1.0,
        )
    with pytest.raises(TypeError, match="TextCanaries"):
        InTrainingCanaryAudit(
            optimizer, num_canaries=0, sample_rate=0.5, seed=0, input_canaries=np.zeros(3)
        )
