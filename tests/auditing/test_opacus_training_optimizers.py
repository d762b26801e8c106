"""OpacusDigitsTrainer's optimizer choice (``optimizer="adamw"``, ``lr_schedule="linear"``,
``weight_decay``): it trains with what it says, and its epsilons are those of the run the
accountant records (``docs/adaptive_optimizers.md``, "Audits")."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import pytest

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.auditing import opacus_training
from opacus_lastiterate.auditing.opacus_training import (
    OpacusDigitsTrainer,
    learning_rates,
    train_dp_sgd,
)
from opacus_lastiterate.auditing.runner import AuditRunner
from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning
from tests.analysis._reference import frozen_adamw_weights

DELTA = 1e-5
STEPS = 20
ADAMW = {
    "optimizer": "adamw", "learning_rate": 0.01, "weight_decay": 0.01, "lr_schedule": "linear",
    "steps": STEPS, "noise_multiplier": 1.0,
}  # fmt: skip

pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning",
    "ignore:Secure RNG turned off:UserWarning",
)


@pytest.fixture(autouse=True)
def _single_thread_torch() -> Iterator[None]:
    """One intra-op thread (as the runner's workers): more only contend on a shared CPU."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _accountant_of_a_run(
    monkeypatch: pytest.MonkeyPatch, trainer: OpacusDigitsTrainer
) -> LastIterateAccountant:
    """Train one run of ``trainer`` (without the canary) with a fresh accountant's hook on its
    DPOptimizer, and return that accountant: what LastIterateAccountant records of the run."""
    accountant = LastIterateAccountant()
    real = opacus_training.train_dp_sgd

    def with_accountant(*args, **kwargs):
        assert kwargs["before_training"] is None  # no canary in this run
        kwargs["before_training"] = lambda optimizer, model, rng: optimizer.attach_step_hook(
            accountant.get_optimizer_hook_fn(sample_rate=trainer.sample_rate)
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(opacus_training, "train_dp_sgd", with_accountant)
    trainer(False, 7)
    return accountant


def test_adamw_trainer_trains_the_run_its_epsilons_describe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = OpacusDigitsTrainer(**ADAMW)  # type: ignore[arg-type]
    accountant = _accountant_of_a_run(monkeypatch, trainer)
    # the run was AdamW with the linear decay and the decoupled weight decay
    trace = [(step.settings, n) for step, n in accountant.adaptive_trace]
    assert {s.optimizer for s, _ in trace} == {"adamw"}
    lrs = np.repeat([s.lr for s, _ in trace], [n for _, n in trace])
    np.testing.assert_allclose(lrs, 0.01 * (STEPS - np.arange(STEPS)) / STEPS, rtol=1e-12)
    assert {s.weight_decay for s, _ in trace} == {0.01}
    assert accountant.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    # the trainer's heuristic is the accountant's Adam heuristic of that run
    with pytest.warns(AdaptiveHeuristicWarning, match="steps = 20"):
        recorded = accountant.get_epsilon(DELTA)
    assert trainer.heuristic_epsilon(DELTA) == pytest.approx(recorded, rel=2e-3)
    # its weights are those of an independent numpy AdamW with the second moment frozen
    # (up to the common factor the heuristic does not see)
    expected = frozen_adamw_weights(
        lrs, noise_std=1.0 * 1.0 / int(400 * trainer.sample_rate), weight_decay=0.01
    )
    weights = trainer.run.weights
    assert weights is not None
    np.testing.assert_allclose(weights / weights[0], expected / expected[0], rtol=1e-9)
    # the standard epsilon does not depend on the weights
    constant = OpacusDigitsTrainer(steps=STEPS, noise_multiplier=1.0)
    assert trainer.standard_epsilon(DELTA) == pytest.approx(constant.standard_epsilon(DELTA))
    assert trainer.heuristic_epsilon(DELTA) < 0.9 * constant.heuristic_epsilon(DELTA)


def test_sgd_trainer_with_the_linear_schedule_records_its_learning_rates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trainer = OpacusDigitsTrainer(steps=STEPS, lr_schedule="linear", learning_rate=0.5)
    accountant = _accountant_of_a_run(monkeypatch, trainer)
    weights = trainer.run.weights
    assert weights is not None  # plain SGD: w_t = lr_t
    np.testing.assert_allclose(weights, 0.5 * (STEPS - np.arange(STEPS)) / STEPS, rtol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SGD: no adaptive caveats, no fallback warning
        recorded = accountant.get_epsilon(DELTA)
    assert trainer.heuristic_epsilon(DELTA) == pytest.approx(recorded, rel=2e-3)


def test_the_default_trainer_is_constant_rate_plain_sgd() -> None:
    trainer = OpacusDigitsTrainer()
    assert (trainer.optimizer, trainer.weight_decay, trainer.lr_schedule) == (
        "sgd",
        0.0,
        "constant",
    )
    assert trainer.run.weights is None
    np.testing.assert_array_equal(learning_rates(0.5, 3, "constant"), [0.5, 0.5, 0.5])
    np.testing.assert_allclose(learning_rates(0.3, 3, "linear"), [0.3, 0.2, 0.1])


def test_an_adamw_audit_through_the_runner_repeats_and_stays_below_the_heuristic() -> None:
    trainer = OpacusDigitsTrainer(**{**ADAMW, "steps": 10})  # type: ignore[arg-type]
    runner = AuditRunner(trainer, trainer.score, num_runs=12, workers=0, progress=False)
    result = runner.audit(delta=DELTA)
    assert result.is_bound and result.epsilon <= trainer.heuristic_epsilon(DELTA)
    rec = runner.run().records[3]
    assert trainer.score(trainer(rec.include_canary, rec.seed)) == rec.score


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"optimizer": "adam"}, r"`optimizer` must be one of \('sgd', 'adamw'\), got 'adam'"),
        ({"weight_decay": -0.1}, "`weight_decay` must be in"),
        ({"lr_schedule": "cosine"}, r"`lr_schedule` must be one of \('constant', 'linear'\)"),
    ],
)
def test_optimizer_options_are_validated(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OpacusDigitsTrainer(**kwargs)
    x, y = np.zeros((4, 64), np.float32), np.zeros(4, np.int64)
    model = OpacusDigitsTrainer().initial_model()
    before = [p.detach().clone() for p in model.parameters()]
    options = {"optimizer": "sgd", "weight_decay": 0.0, "lr_schedule": "constant", **kwargs}
    with pytest.raises(ValueError, match=match):
        train_dp_sgd(
            model, x, y, seed=0, steps=1, batch_size=2, noise_multiplier=1.0,
            max_grad_norm=1.0, learning_rate=0.1, **options,
        )  # fmt: skip
    assert all((a == b).all() for a, b in zip(before, model.parameters(), strict=True))
