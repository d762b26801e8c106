"""PyTorch Lightning: DP-SGD on scikit-learn's digits with the privacy monitor as a callback.

Opacus makes the model, optimizer and Poisson-sampling loader private; Lightning's Trainer
runs them; ``PrivacyMonitorCallback`` logs the heuristic, robust and standard epsilon of every
step to a JSONL file and stops training at a budget (``docs/callbacks.md``). The monitor's
state goes into Lightning checkpoints, so a resumed run continues the same log.

    python examples/lightning_digits.py --epochs 5 --budget 3
    python examples/lightning_digits.py --quick     # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from opacus_lastiterate.callbacks import (
    JsonlSink,
    PrivacyBudget,
    PrivacyMonitor,
    PrivacyMonitorCallback,
)


class DigitsClassifier(pl.LightningModule):
    """A small MLP; the optimizer is the DPOptimizer that ``make_private`` returned."""

    def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__()
        self.net, self.dp_optimizer = net, optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return self.dp_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="expected batch size")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--budget", type=float, default=None, help="stop at this heuristic eps")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=Path("examples/output/lightning_digits"))
    parser.add_argument("--quick", action="store_true", help="one epoch (CI)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", module="lightning")
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    engine = PrivacyEngine(accountant="last_iterate")
    net, optimizer, loader = engine.make_private(
        module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.5),
        data_loader=DataLoader(data, batch_size=args.batch_size),
        noise_multiplier=args.sigma, max_grad_norm=1.0,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "privacy.jsonl"
    log.unlink(missing_ok=True)
    budget = None if args.budget is None else PrivacyBudget(args.budget, action="stop")
    monitor = PrivacyMonitor(engine, delta=args.delta, sinks=[JsonlSink(log)], budget=budget)
    trainer = pl.Trainer(
        max_epochs=1 if args.quick else args.epochs, accelerator="auto",
        callbacks=[PrivacyMonitorCallback(monitor)], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(DigitsClassifier(net, optimizer), train_dataloaders=loader)
    final = monitor.finish()
    print(f"{engine.accountant.num_steps} steps; last record: {final}")
    if monitor.stop_reason:
        print(f"stopped: {monitor.stop_reason}")
    print(f"per-step log: {log}")


if __name__ == "__main__":
    main()
