"""Lightning adapter: a few steps with Trainer(accelerator="cpu"), logged epsilon equals the
accountant's at each step, budget stop, checkpoint round trip, Opacus's DPLightningDataModule."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyBudget, PrivacyMonitor
from tests.callbacks.conftest import DELTA, DEVICES

# Queued steps of one setting are solved together (IncrementalHeuristic.advance): their
# epsilons equal the accountant's step-by-step values to the root finder's tolerance
# (about 1e-13 relative), not bit for bit.
BATCHED = 1e-12

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


def _trainer(
    namespace: Any, callback: Any, max_steps: int, tmp_path: Path, *more: Any,
    accelerator: str = "cpu", **kw: Any,
) -> Any:
    return namespace.Trainer(
        max_steps=max_steps, accelerator=accelerator, devices=1, callbacks=[callback, *more],
        logger=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        enable_checkpointing=False, **kw,
    )


class _Checker:
    """A sink keeping the records, and a callback (:meth:`probe`) asking the accountant for
    epsilon after every step: what the records must equal."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.records, self.expected = engine, [], []
        self.devices: list[str] = []  # where the parameters were at each step

    def __call__(self, record: EpsilonRecord) -> None:
        self.records.append(record)

    def probe(self, namespace: Any) -> Any:
        checker = self

        class Probe(namespace.Callback):  # type: ignore[misc,name-defined]
            def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
                checker.devices.append(next(module.parameters()).device.type)
                acc = checker.engine.accountant
                checker.expected.append((acc.num_steps, acc.get_epsilon(DELTA)))

        return Probe()


@pytest.mark.parametrize("device", DEVICES)
def test_lightning_trainer_logs_the_accountant_epsilon(tmp_path: Path, device: str) -> None:
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    torch.manual_seed(0)
    engine = PrivacyEngine(accountant="last_iterate")
    checker = _Checker(engine)
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[checker], robust_every=2)
    callback = PrivacyMonitorCallback(monitor)
    accelerator = "gpu" if device == "cuda" else "cpu"
    trainer = _trainer(pl, callback, 5, tmp_path, checker.probe(pl), accelerator=accelerator)
    module = _module_class(pl.LightningModule)(engine, poisson=True)
    trainer.fit(module, DataLoader(_data(), batch_size=32))
    assert checker.devices == [device] * 5
    steps = [r.step for r in checker.records]
    assert steps == [1, 2, 3, 4, 5, 5] and checker.records[-1].final
    for r, (n, eps) in zip(checker.records, checker.expected + [checker.expected[-1]], strict=True):
        assert r.step == n and r.heuristic_epsilon == pytest.approx(eps, rel=BATCHED)
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
    from opacus.data_loader import DPDataLoader

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
    # the Trainer must iterate Poisson batches for the Poisson limit to be the run's
    loader = DPDataLoader.from_data_loader(DataLoader(_data(), batch_size=32))
    trainer.fit(_module_class(pl.LightningModule)(engine, poisson=True), loader)
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
    trainer = _trainer(ptl, PLPrivacyMonitorCallback(monitor), 4, tmp_path, checker.probe(ptl))
    model = _module_class(ptl.LightningModule)(engine, poisson=False)
    trainer.fit(model, datamodule=DPLightningDataModule(Data()))
    assert [r.step for r in checker.records] == [1, 2, 3, 4, 4]
    for r, (n, eps) in zip(checker.records, checker.expected + [checker.expected[-1]], strict=True):
        assert r.step == n and r.heuristic_epsilon == pytest.approx(eps, rel=BATCHED)
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


# -- resuming from a checkpoint ----------------------------------------------------------------


def _log_rows(path: Path) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_log(resumed: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    """Every step once, the same values: the settings and the RDP vector exactly, the
    epsilons computed afresh after the resume to the root finder's tolerance."""
    assert [(r["step"], r["final"]) for r in resumed] == [
        (r["step"], r["final"]) for r in reference
    ]
    for got, want in zip(resumed, reference, strict=True):
        for key in ("lr", "noise_multiplier", "sample_rate", "opacus_rdp_epsilon", "delta"):
            assert got[key] == want[key], (got["step"], key)
        for key in ("heuristic_epsilon", "robust_heuristic_epsilon", "standard_epsilon"):
            assert (got[key] is None) == (want[key] is None), (got["step"], key)
            if want[key] is not None:
                assert got[key] == pytest.approx(want[key], rel=1e-12), (got["step"], key)


class _Crash(RuntimeError):
    pass


def _lightning_run(
    tmp_path: Path, log: Path, *, crash_at: int | None = None, ckpt_path: Path | None = None
) -> Any:
    from lightning.pytorch.callbacks import ModelCheckpoint
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import JsonlSink, PrivacyMonitorCallback

    torch.manual_seed(0)
    engine = PrivacyEngine(accountant="last_iterate")
    monitor = PrivacyMonitor(
        engine, delta=DELTA, sinks=[JsonlSink(log)], flush_every=2, robust_every=3,
        standard_every=5,
    )
    base = _module_class(pl.LightningModule)

    class Module(base):  # type: ignore[misc,valid-type]
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if crash_at is not None and self.trainer.global_step == crash_at:
                raise _Crash(f"interrupted after step {crash_at}")
            return super().training_step(batch, batch_idx)

    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, save_last=False
    )
    trainer = pl.Trainer(
        max_steps=8, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[PrivacyMonitorCallback(monitor), checkpoints],
    )
    trainer.fit(
        Module(engine, poisson=True), DataLoader(_data(), batch_size=32), ckpt_path=ckpt_path
    )
    return engine


def test_lightning_resume_from_checkpoint_continues_the_log(tmp_path: Path) -> None:
    """A run checkpointed at step 4 and killed after step 6 (steps 5-6 already logged),
    resumed by a new Trainer from the checkpoint, logs steps 1..8 once each, with the values
    of an uninterrupted run."""
    reference = tmp_path / "reference.jsonl"
    _lightning_run(tmp_path / "a", reference)
    log = tmp_path / "resumed.jsonl"
    with pytest.raises(_Crash):
        _lightning_run(tmp_path / "b", log, crash_at=6)
    assert [r["step"] for r in _log_rows(log)] == [1, 2, 3, 4, 5, 6]
    ckpt = tmp_path / "b" / "ckpt" / "epoch=0-step=4.ckpt"
    assert ckpt.exists()
    engine = _lightning_run(tmp_path / "c", log, ckpt_path=ckpt)
    assert engine.accountant.history == [(1.0, 1 / 8, 8)]
    assert_same_log(_log_rows(log), _log_rows(reference))


def test_lightning_shuffled_run_logs_shuffled_values_and_labels(tmp_path: Path) -> None:
    """The Trainer iterates a shuffled loader (2 whole epochs of 8 batches): the callback
    tells the monitor, whose records carry the shuffled heuristic (closed form: a Gaussian
    mechanism with mu = 2 / sqrt(16), computed here with scipy) and the shuffled labels."""
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback
    from tests._gaussian import gaussian_mechanism_epsilon

    torch.manual_seed(0)
    engine = PrivacyEngine(accountant="last_iterate")
    records: list[Any] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append])
    trainer = _trainer(pl, PrivacyMonitorCallback(monitor), 16, tmp_path)
    loader = DataLoader(_data(), batch_size=32, shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(_module_class(pl.LightningModule)(engine, poisson=False), loader)
    final = records[-1]
    assert final.final and final.step == 16 and final.sampling == "shuffled"
    expected = gaussian_mechanism_epsilon(2 / np.sqrt(16), DELTA)
    assert final.heuristic_epsilon == pytest.approx(expected, rel=1e-9)
    assert final.poisson_assumed_epsilon is not None
    labels = final.labels()
    assert "without amplification" in labels["standard_epsilon"]
    assert labels["poisson_assumed_epsilon"].startswith("assumes Poisson sampling")
