"""Lightning adapter: a few steps with Trainer(accelerator="cpu"), logged epsilon equals the
accountant's at each step, budget stop, checkpoint round trip, Opacus's DPLightningDataModule."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyBudget, PrivacyMonitor
from tests.callbacks.conftest import DELTA

pl = pytest.importorskip("lightning.pytorch")


def _module_class(base: Any) -> Any:
    """The Opacus Lightning example's pattern: make_private in configure_optimizers."""

    class DPModule(base):  # type: ignore[misc,valid-type]
        def __init__(self, engine: Any, poisson: bool) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
            self.engine, self.poisson = engine, poisson

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            loader = self.trainer.fit_loop._data_source.dataloader()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, optimizer, _ = self.engine.make_private(
                    module=self,
                    optimizer=optimizer,
                    data_loader=loader,
                    noise_multiplier=1.0,
                    max_grad_norm=1.0,
                    poisson_sampling=self.poisson,
                )
            return optimizer

    return DPModule


def _data(seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))


def _trainer(namespace: Any, callback: Any, max_steps: int, tmp_path: Path, **kw: Any) -> Any:
    return namespace.Trainer(
        max_steps=max_steps, accelerator="cpu", devices=1, callbacks=[callback], logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        enable_checkpointing=False, **kw,
    )


class _Checker:
    """A sink that compares each record with the accountant at that moment."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.records, self.expected = engine, [], []

    def __call__(self, record: EpsilonRecord) -> None:
        self.records.append(record)
        acc = self.engine.accountant
        self.expected.append((acc.num_steps, acc.get_epsilon(DELTA)))


def test_lightning_trainer_logs_the_accountant_epsilon(tmp_path: Path) -> None:
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    torch.manual_seed(0)
    engine = PrivacyEngine(accountant="last_iterate")
    checker = _Checker(engine)
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[checker], robust_every=2)
    callback = PrivacyMonitorCallback(monitor)
    trainer = _trainer(pl, callback, 5, tmp_path)
    trainer.fit(_module_class(pl.LightningModule)(engine, poisson=True), DataLoader(_data(), batch_size=32))
    steps = [r.step for r in checker.records]
    assert steps == [1, 2, 3, 4, 5, 5] and checker.records[-1].final
    for r, (n, eps) in zip(checker.records, checker.expected, strict=True):
        assert r.step == n and r.heuristic_epsilon == eps
    assert engine.accountant.num_steps == 5 == trainer.global_step
    # checkpoint: the callback's state holds the accountant's history
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=True)
    state = ckpt["callbacks"]["PrivacyMonitorCallback"]
    assert state["accountant"]["history"] == [[1.0, 1 / 8, 5]]
    fresh = PrivacyEngine(accountant="last_iterate")
    restored = PrivacyMonitorCallback(PrivacyMonitor(fresh, delta=DELTA))
    restored.load_state_dict(state)
    assert fresh.accountant.history == engine.accountant.history
    assert restored.monitor.last_record == checker.records[-1]


def test_lightning_budget_stop_ends_training(tmp_path: Path) -> None:
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    torch.manual_seed(0)
    probe = PrivacyEngine(accountant="last_iterate")
    probe.accountant.history = [(1.0, 1 / 8, 3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        limit = probe.accountant.get_epsilon(DELTA)  # epsilon after exactly 3 steps
    engine = PrivacyEngine(accountant="last_iterate")
    monitor = PrivacyMonitor(
        engine, delta=DELTA, budget=PrivacyBudget(limit * (1 + 1e-9), action="stop")
    )
    trainer = _trainer(pl, PrivacyMonitorCallback(monitor), 20, tmp_path)
    trainer.fit(_module_class(pl.LightningModule)(engine, poisson=True), DataLoader(_data(), batch_size=32))
    assert monitor.should_stop and engine.accountant.num_steps == 3
    assert trainer.global_step <= 4  # the refused step 4 is counted by Lightning, not applied


def test_opacus_dp_lightning_data_module(tmp_path: Path) -> None:
    ptl = pytest.importorskip("pytorch_lightning")
    from opacus import PrivacyEngine
    from opacus.lightning import DPLightningDataModule

    from opacus_lastiterate.callbacks.lightning import PLPrivacyMonitorCallback

    class Data(ptl.LightningDataModule):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(_data(), batch_size=32)

    torch.manual_seed(0)
    engine = PrivacyEngine(accountant="last_iterate")
    checker = _Checker(engine)
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[checker])
    trainer = _trainer(ptl, PLPrivacyMonitorCallback(monitor), 4, tmp_path)
    model = _module_class(ptl.LightningModule)(engine, poisson=False)
    trainer.fit(model, datamodule=DPLightningDataModule(Data()))
    assert [r.step for r in checker.records] == [1, 2, 3, 4, 4]
    for r, (n, eps) in zip(checker.records, checker.expected, strict=True):
        assert r.step == n and r.heuristic_epsilon == eps
    assert engine.accountant.history == [(1.0, 1 / 8, 4)]


def test_callback_arguments_and_missing_dp_optimizer(tmp_path: Path) -> None:
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    with pytest.raises(TypeError, match="`monitor`"):
        PrivacyMonitorCallback(object())  # type: ignore[arg-type]

    class Plain(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 4)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    monitor = PrivacyMonitor(PrivacyEngine(accountant="last_iterate"), delta=DELTA)
    trainer = _trainer(pl, PrivacyMonitorCallback(monitor), 1, tmp_path)
    with pytest.raises(ValueError, match="no Opacus DPOptimizer"):
        trainer.fit(Plain(), DataLoader(_data(), batch_size=32))
