"""The in-training canary audit's known-answer set-up under AdamW (``docs/adaptive_optimizers.md``,
"Audits"): gradient canaries on coordinates the data never move, a real Opacus run of torch's
AdamW with a linear decay to 0 and decoupled weight decay. On each canary's coordinate AdamW
runs its exact one-dimensional recursion (random second moment included), so the final
model's epsilon there is the one the Adam study simulated, which stayed at or below the
frozen-second-moment heuristic; the one-run lower bounds must stay below that heuristic,
which the report takes from the accountant's AdamW trace."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.callbacks import InTrainingAuditReport, InTrainingCanaryAudit
from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning
from tests.analysis._reference import frozen_adamw_weights

DELTA = 1e-5
SIGMA, CLIP = 1.0, 1.0
N, BATCH = 200, 20  # Poisson rate q = 0.1, expected batch size 20
STEPS, LR, WEIGHT_DECAY = 100, 0.01, 0.01


def _linear_decay(step: int) -> float:
    """The Hugging Face linear schedule without warm-up: the multiplier of step ``step``."""
    return (STEPS - step) / STEPS


def _adamw_audit(
    m: int, seed: int, *, standard: bool = True
) -> tuple[InTrainingAuditReport, object]:
    """A linear model on d = 2m coordinates, data on the first m, m canaries drawn from the
    last m (zero gradient from the data there, zero initial weights), trained for STEPS
    steps of Opacus + AdamW; returns the audit's report and the accountant."""
    d = 2 * m
    torch.manual_seed(seed)
    model = nn.Linear(d, 1, bias=False)
    nn.init.zeros_(model.weight)
    x = torch.zeros(N, d)
    x[:, :m] = torch.randn(N, m)
    y = torch.randn(N, 1)
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        private, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY),
            data_loader=DataLoader(TensorDataset(x, y), batch_size=BATCH),
            noise_multiplier=SIGMA,
            max_grad_norm=CLIP,
            poisson_sampling=True,
        )
    q = 1 / len(loader)
    audit = InTrainingCanaryAudit(
        optimizer, num_canaries=m, sample_rate=q, seed=seed, accountant=engine.accountant,
        candidates=np.arange(m, d),
    )  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _linear_decay)
    taken = 0
    while taken < STEPS:
        for xb, yb in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(private(xb), yb).backward()
            optimizer.step()
            schedule.step()
            taken += 1
            if taken == STEPS:
                break
    return audit.report(delta=DELTA, standard=standard), engine.accountant


def _independent_adam_heuristic() -> float:
    """The frozen-second-moment heuristic of the run, its weights from a numpy AdamW."""
    lrs = [LR * _linear_decay(t) for t in range(STEPS)]
    w = frozen_adamw_weights(lrs, noise_std=SIGMA * CLIP / BATCH, weight_decay=WEIGHT_DECAY)
    run = DPSGDRun.constant(steps=STEPS, sample_rate=BATCH / N, noise_multiplier=SIGMA)
    return privacy_model("heuristic", DPSGDRun(run.segments, weights=w)).epsilon(DELTA)


def test_known_answer_under_adamw_bound_positive_and_below_the_adam_heuristic() -> None:
    report, accountant = _adamw_audit(m=1000, seed=0, standard=False)
    # the report's heuristic is the accountant's Adam heuristic of this AdamW run ...
    assert accountant.heuristic_label == ADAPTIVE_HEURISTIC_LABEL  # type: ignore[attr-defined]
    with pytest.warns(AdaptiveHeuristicWarning, match="steps = 100"):
        assert report.heuristic_epsilon == pytest.approx(accountant.get_epsilon(DELTA))  # type: ignore[attr-defined]
    # ... which is the weighted heuristic of an independent numpy AdamW's weights, and not
    # the constant-rate formula (the linear decay lowers it by about a quarter)
    assert report.heuristic_epsilon == pytest.approx(_independent_adam_heuristic(), rel=2e-3)
    constant = DPSGDRun.constant(steps=STEPS, sample_rate=BATCH / N, noise_multiplier=SIGMA)
    assert report.heuristic_epsilon < 0.85 * privacy_model("heuristic", constant).epsilon(DELTA)
    grad = report.audit("gradient")
    assert report.steps == STEPS and grad.num_canaries == 1000
    for result in (grad.one_run, grad.one_run_fdp):
        # the canaries' signal went through AdamW (a clearly positive bound), and the valid
        # one-run bound stays below the Adam heuristic
        assert result.is_bound
        assert 0.3 < result.epsilon <= report.heuristic_epsilon


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(1, 5))
def test_known_answer_under_adamw_more_canaries(seed: int) -> None:
    report, _ = _adamw_audit(m=2000, seed=seed)
    assert report.heuristic_epsilon is not None and report.standard_epsilon is not None
    grad = report.audit("gradient")
    for result in (grad.one_run, grad.one_run_fdp):
        assert result.is_bound
        assert 0.3 < result.epsilon <= report.heuristic_epsilon <= report.standard_epsilon
