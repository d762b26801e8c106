"""Hugging Face adapter: transformers 5.x Trainer with Opacus 1.6's wrap_model=False mode;
logged epsilon equals the accountant's at each step; budget stop; state in checkpoints."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyBudget, PrivacyMonitor
from tests.callbacks.conftest import DELTA, DEVICES

# Queued steps of one setting are solved together (IncrementalHeuristic.advance): their
# epsilons equal the accountant's step-by-step values to the root finder's tolerance
# (about 1e-13 relative), not bit for bit.
BATCHED = 1e-12

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class _Data(Dataset):
    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.net(x)
        out: dict[str, Any] = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def _setup(
    tmp_path: Path, max_steps: int, budget: PrivacyBudget | None = None, device: str = "cpu",
    make_optimizer: Any = None, **kw: Any,
):
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import HFPrivacyCallback

    torch.manual_seed(0)
    data, model = _Data(), _Net()
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooks, optimizer, _ = engine.make_private(
            module=model,
            optimizer=(make_optimizer or (lambda p: torch.optim.SGD(p, lr=0.1)))(
                model.parameters()
            ),
            data_loader=DataLoader(data, batch_size=32), noise_multiplier=1.0,
            max_grad_norm=1.0, wrap_model=False,
        )
    records: list[EpsilonRecord] = []
    expected: list[tuple[int, float]] = []
    devices: list[str] = []  # where the parameters were at each step

    class Probe(transformers.TrainerCallback):  # the accountant asked after every step
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            devices.append(next(model.parameters()).device.type)
            acc = engine.accountant
            expected.append((acc.num_steps, acc.get_epsilon(DELTA)))
            return control

    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[records.append], budget=budget, robust_every=2,
        weighted_every=1,  # the Trainer's linear decay: the weighted heuristic, every step
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=32,
        learning_rate=0.1, max_grad_norm=0.0, report_to=[], use_cpu=device == "cpu",
        logging_strategy="no", disable_tqdm=True, seed=0, **kw,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, optimizers=(optimizer, None),
        callbacks=[HFPrivacyCallback(monitor, key=f"test-{tmp_path.name}"), Probe()],
    )
    trainer.probed_devices = devices  # type: ignore[attr-defined]
    return engine, monitor, trainer, records, expected, hooks


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_logs_the_accountant_epsilon(tmp_path: Path, device: str) -> None:
    engine, _monitor, trainer, records, expected, _ = _setup(
        tmp_path, 4, save_strategy="no", device=device
    )
    trainer.train()
    assert trainer.probed_devices == [device] * 4
    assert [r.step for r in records] == [1, 2, 3, 4, 4] and records[-1].final
    for r, (n, eps) in zip(records, expected + expected[-1:], strict=True):
        assert r.step == n and r.heuristic_epsilon == pytest.approx(eps, rel=BATCHED)
    lrs = [r.lr for r in records[:4]]
    assert lrs[0] == pytest.approx(0.1) and lrs == sorted(lrs, reverse=True)  # linear decay
    assert engine.accountant.num_steps == 4 == trainer.state.global_step


def test_budget_stop_sets_should_training_stop(tmp_path: Path) -> None:
    # Poisson declared (detection then leaves it): its heuristic grows step by step, so a
    # limit between steps 2 and 3 stops the run after 2 (within an epoch of shuffled
    # batches the heuristic falls: test_trainer_shuffled_batches_are_accounted_and_labelled)
    engine0, _, trainer0, records0, _, _ = _setup(tmp_path / "ref", 3, save_strategy="no")
    engine0.accountant.declare_sampling(None)
    trainer0.train()
    limit = records0[1].heuristic_epsilon  # after step 2
    assert limit is not None
    engine, monitor, trainer, _records, _, _ = _setup(
        tmp_path / "run", 10, PrivacyBudget(limit, action="stop"), save_strategy="no"
    )
    engine.accountant.declare_sampling(None)
    trainer.train()
    assert monitor.should_stop and engine.accountant.num_steps == 2
    assert trainer.state.global_step == 3  # the refused step ends training, unapplied


def test_state_is_saved_in_trainer_checkpoints_and_restored(tmp_path: Path) -> None:
    from opacus_lastiterate.callbacks import HFPrivacyCallback

    engine, _monitor, trainer, _, _, _ = _setup(tmp_path, 3, save_strategy="steps", save_steps=3)
    trainer.train()
    state_file = tmp_path / "checkpoint-3" / "trainer_state.json"
    saved = json.loads(state_file.read_text())["stateful_callbacks"]["HFPrivacyCallback"]
    assert saved["attributes"]["monitor_state"]["accountant"]["history"] == [[1.0, 0.125, 3]]
    # what Trainer._load_callback_state does on resume: rebuild from args, set attributes
    from opacus import PrivacyEngine

    fresh = PrivacyEngine(accountant="last_iterate")
    original = HFPrivacyCallback(PrivacyMonitor(fresh, delta=DELTA), key="resume")
    rebuilt = HFPrivacyCallback(**{**saved["args"], "key": "resume"})
    for name, value in saved["attributes"].items():
        setattr(rebuilt, name, value)
    assert rebuilt.monitor is original.monitor
    assert fresh.accountant.history == engine.accountant.history
    with pytest.raises(ValueError, match="no PrivacyMonitor is registered"):
        HFPrivacyCallback(key="nobody")


class _Crash(RuntimeError):
    pass


def _hf_run(out: Path, log: Path, *, crash_at: int | None = None, resume: str | None = None):
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import HFPrivacyCallback, JsonlSink

    torch.manual_seed(0)
    data, model = _Data(), _Net()
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, optimizer, _ = engine.make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            data_loader=DataLoader(data, batch_size=32), noise_multiplier=1.0,
            max_grad_norm=1.0, wrap_model=False,
        )
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[JsonlSink(log)], flush_every=2, robust_every=3,
        standard_every=5, weighted_every=1,  # "auto" depends on measured time: not repeatable
    )

    class Crash(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            if crash_at is not None and state.global_step == crash_at:
                raise _Crash(f"interrupted after step {crash_at}")
            return control

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=8, per_device_train_batch_size=32, learning_rate=0.1,
        max_grad_norm=0.0, report_to=[], use_cpu=True, logging_strategy="no",
        disable_tqdm=True, seed=0, save_strategy="steps", save_steps=4,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, optimizers=(optimizer, None),
        callbacks=[HFPrivacyCallback(monitor, key=f"resume-{out.name}"), Crash()],
    )
    trainer.train(resume_from_checkpoint=resume)
    return engine


def test_trainer_resume_from_checkpoint_continues_the_log(tmp_path: Path) -> None:
    """Checkpoint at step 4, killed after step 6 (steps 5-6 logged), resumed by a new Trainer
    with the default TrainingArguments (restore_callback_states_from_checkpoint=False): the
    log has steps 1..8 once each, with the values of an uninterrupted run (linear learning
    rate decay restored from the checkpoint)."""
    from tests.callbacks.test_lightning import assert_same_log

    reference = tmp_path / "reference.jsonl"
    _hf_run(tmp_path / "a", reference)
    log = tmp_path / "resumed.jsonl"
    with pytest.raises(_Crash):
        _hf_run(tmp_path / "b", log, crash_at=6)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    engine = _hf_run(tmp_path / "b", log, resume=str(tmp_path / "b" / "checkpoint-4"))
    assert engine.accountant.history == [(1.0, 0.125, 8)]
    ref_rows = [json.loads(line) for line in reference.read_text().splitlines()]
    assert_same_log([json.loads(line) for line in log.read_text().splitlines()], ref_rows)
    assert len({r["lr"] for r in ref_rows}) > 4  # the schedule did change the rate


def test_trainer_shuffled_batches_are_accounted_and_labelled(tmp_path: Path) -> None:
    """make_private saw a sequential loader; the Trainer iterates its own shuffled one
    (N = 256, B = 32). The callback tells the monitor, so the accountant and the log
    account shuffled batches: every record says so, its labels name the scheme, and the
    heuristic is the accountant's shuffled value, not the Poisson one of the same history."""
    from opacus_lastiterate.analysis.sampling import ShuffledBatches

    engine, _monitor, trainer, records, expected, _ = _setup(tmp_path, 4, save_strategy="no")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert engine.accountant.sampling == ShuffledBatches(256, 32, False)
    assert {r.sampling for r in records} == {"shuffled"}
    final = records[-1]
    assert final.final and final.heuristic_epsilon == pytest.approx(expected[-1][1], rel=BATCHED)
    assert "[batches: shuffled]" in final.labels()["heuristic_epsilon"]
    assert final.poisson_assumed_epsilon is not None
    assert final.standard_epsilon is not None and final.standard_epsilon > final.poisson_assumed_epsilon
    poisson = engine.accountant.with_history(engine.accountant.history)
    poisson.declare_sampling(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert abs(poisson.get_epsilon(DELTA) - final.heuristic_epsilon) > 1e-3


def test_default_trainer_adamw_logs_the_adaptive_heuristic_every_step(tmp_path: Path) -> None:
    """The Trainer's defaults: torch AdamW (betas 0.9/0.999, eps 1e-8, no weight decay) and
    its linear decay schedule. Every step's record carries the accountant's adaptive
    heuristic (labelled "heuristic; adaptive second moment treated as fixed"), with no
    fallback to the constant-rate formula."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
        ADAPTIVE_HEURISTIC_LABEL,
    )
    from opacus_lastiterate.exceptions import AdaptiveHeuristicWarning, OptimizerTraceWarning

    def adamw(params: Any) -> torch.optim.Optimizer:  # what TrainingArguments defaults to
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    engine, _monitor, trainer, records, expected, _ = _setup(
        tmp_path, 5, save_strategy="no", make_optimizer=adamw,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    fallbacks = [w for w in caught if issubclass(w.category, OptimizerTraceWarning)]
    assert fallbacks == []
    caveats = [w for w in caught if issubclass(w.category, AdaptiveHeuristicWarning)]
    assert len(caveats) <= 2  # once per run, per accountant asked (the Probe's, the monitor's)
    acc = engine.accountant
    assert acc.heuristic_label == ADAPTIVE_HEURISTIC_LABEL
    assert {s.settings.optimizer for s, _ in acc.adaptive_trace} == {"adamw"}
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 5] and records[-1].final
    assert {r.sampling for r in records} == {"shuffled"}  # the Trainer shuffles
    for r, (n, eps) in zip(records, expected + expected[-1:], strict=True):
        assert r.step == n and r.heuristic_epsilon is not None
        assert r.heuristic_epsilon == pytest.approx(eps, rel=2 * acc.weight_accuracy)
        assert r.optimizer == "adamw"  # the record labels its heuristic as the adaptive one
        assert ADAPTIVE_HEURISTIC_LABEL in r.labels()["heuristic_epsilon"]
    lrs = [r.lr for r in records[:5]]
    assert lrs == sorted(lrs, reverse=True) and len(set(lrs)) == 5  # the linear decay
