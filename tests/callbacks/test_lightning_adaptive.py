"""Lightning with Adam or AdamW and a LambdaLR warm-up (what ``configure_optimizers`` usually
returns), Opacus's ``make_private`` inside it and the package's Lightning adapter: the log has
the adaptive heuristic at every step, labelled "heuristic; adaptive second moment treated as
fixed", without the constant-rate fallback warning; each value equals the weighted heuristic
of an independent numpy Adam/AdamW with the second moment frozen at its expectation under
the noise, driven by unit impulses at the learning rates Lightning's scheduler set, for the
batches Lightning draws (its own loader's, in order: deterministic batches)."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyMonitor
from opacus_lastiterate.exceptions import OptimizerTraceWarning
from tests.callbacks.conftest import DELTA

pl = pytest.importorskip("lightning.pytorch")

N, BATCH, SIGMA, CLIP, LR, BETAS, WD = 256, 32, 1.0, 1.0, 0.01, (0.9, 0.99), 0.1
WARMUP, STEPS = 3, 8

pytestmark = pytest.mark.filterwarnings(
    "ignore::opacus_lastiterate.exceptions.AdaptiveHeuristicWarning",  # a short run: warned
    "ignore:Full backward hook is firing:UserWarning",
)


def _lambda(step: int) -> float:
    return (step + 1) / WARMUP if step < WARMUP else (STEPS - step) / (STEPS - WARMUP)


class AdamModule(pl.LightningModule):  # type: ignore[misc,name-defined]
    def __init__(self, engine: Any, name: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
        self.engine, self.name = engine, name

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[self.name]
        optimizer = cls(self.parameters(), lr=LR, betas=BETAS, weight_decay=WD)
        loader = self.trainer.fit_loop._data_source.dataloader()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, optimizer, _ = self.engine.make_private(
                module=self, optimizer=optimizer, data_loader=loader,
                noise_multiplier=SIGMA, max_grad_norm=CLIP,
            )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lambda)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _numpy_weights(name: str, lrs: list[float]) -> np.ndarray:
    """Adam (L2 decay in the gradient) or AdamW (decoupled decay) on one coordinate, v_t
    frozen at its expectation under N(0, (sigma C / B)^2) gradients; w_t = minus the final
    parameter's response to a unit gradient at step t."""
    b1, b2 = BETAS
    s2 = (SIGMA * CLIP / BATCH) ** 2
    n = len(lrs)
    v, acc = np.empty(n), 0.0
    for t in range(n):
        acc = b2 * acc + (1 - b2) * s2
        v[t] = acc
    w = np.empty(n)
    for impulse in range(n):
        p = m = 0.0
        for t in range(n):
            g = float(t == impulse)
            if name == "adamw":
                p *= 1 - lrs[t] * WD
            else:
                g += WD * p
            m = b1 * m + (1 - b1) * g
            denom = math.sqrt(v[t] / (1 - b2 ** (t + 1))) + 1e-8
            p -= lrs[t] * m / (1 - b1 ** (t + 1)) / denom
        w[impulse] = -p
    return w


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_lightning_adam_logs_the_labelled_adaptive_heuristic_every_step(
    tmp_path: Path, name: str
) -> None:
    from opacus import PrivacyEngine

    from opacus_lastiterate.callbacks import PrivacyMonitorCallback

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(N, 16, generator=g), torch.randint(0, 4, (N,), generator=g))
    engine = PrivacyEngine(accountant="last_iterate")
    records: list[EpsilonRecord] = []
    monitor = PrivacyMonitor(engine, delta=DELTA, sinks=[records.append], weighted_every=1,
                             flush_every=None)
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, callbacks=[PrivacyMonitorCallback(monitor)],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizerTraceWarning)  # no constant-rate fallback
        trainer.fit(AdamModule(engine, name), DataLoader(data, batch_size=BATCH))
    assert [r.step for r in records] == [*range(1, STEPS + 1), STEPS]  # + the final record
    assert records[-1].final
    lrs = [r.lr for r in records[:STEPS]]
    assert lrs == pytest.approx([LR * _lambda(k) for k in range(STEPS)], rel=1e-12)
    assert engine.accountant.adaptive_optimizer == name
    q = 1 / len(DataLoader(data, batch_size=BATCH))
    # Lightning draws the batches of its own loader (in order, not Opacus's Poisson ones):
    # the adapter tells the monitor, and the numbers are that scheme's
    scheme = engine.accountant.sampling
    assert {r.sampling for r in records} == {"deterministic"}
    for r in records:
        assert r.optimizer == name
        label = r.labels()["heuristic_epsilon"]
        assert ADAPTIVE_HEURISTIC_LABEL in label and name in label
        assert r.heuristic_epsilon is not None
        w = _numpy_weights(name, lrs[: r.step])
        run = DPSGDRun.from_history([(SIGMA, q, r.step)], weights=w, sampling=scheme)
        expected = privacy_model("heuristic", run).epsilon(DELTA)
        assert r.heuristic_epsilon == pytest.approx(expected, rel=2e-3)
    # the constant-rate formula is another number at this schedule: the weights are in use
    plain = privacy_model("heuristic", DPSGDRun.constant(
        steps=STEPS, sample_rate=q, noise_multiplier=SIGMA, sampling=scheme)).epsilon(DELTA)
    assert abs(records[-1].heuristic_epsilon - plain) > 1e-2 * plain
