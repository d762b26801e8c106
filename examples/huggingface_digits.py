"""Hugging Face Trainer: DP-SGD on scikit-learn's digits with the privacy monitor callback.

Opacus 1.6's ``make_private(..., wrap_model=False)`` puts its hooks on the model and returns
a ``DPOptimizer`` that the Trainer drives; ``HFPrivacyCallback`` logs the heuristic, robust and
standard epsilon of every step to a JSONL file and turns a budget stop into
``control.should_training_stop`` (``docs/callbacks.md``). ``max_grad_norm=0`` in the
TrainingArguments: Opacus clips per example, the Trainer must not clip again. The Trainer
samples fixed-size shuffled batches (not Poisson), while the accountant records
q = 1 / len(data_loader): the module docs of ``opacus_lastiterate.callbacks.huggingface``
say what that means for the guarantee.

    python examples/huggingface_digits.py --steps 200 --budget 3
    python examples/huggingface_digits.py --quick    # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer, TrainingArguments

from opacus_lastiterate.callbacks import HFPrivacyCallback, JsonlSink, PrivacyBudget, PrivacyMonitor


class Digits(Dataset):
    """scikit-learn's digits as the Trainer wants them: dicts of forward() arguments."""

    def __init__(self) -> None:
        x, y = load_digits(return_X_y=True)
        self.x = torch.tensor(x / 16.0, dtype=torch.float32)
        self.labels = torch.tensor(y)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.labels[i]}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--budget", type=float, default=None, help="stop at this heuristic eps")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=Path("examples/output/huggingface_digits"))
    parser.add_argument("--quick", action="store_true", help="10 steps (CI)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    torch.manual_seed(0)
    train_set, model = Digits(), MLP()
    engine = PrivacyEngine(accountant="last_iterate")
    _, dp_optimizer, _ = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        data_loader=DataLoader(train_set, batch_size=args.batch_size),
        noise_multiplier=args.sigma, max_grad_norm=1.0, wrap_model=False,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "privacy.jsonl"
    log.unlink(missing_ok=True)
    budget = None if args.budget is None else PrivacyBudget(args.budget, action="stop")
    monitor = PrivacyMonitor(engine, delta=args.delta, sinks=[JsonlSink(log)], budget=budget)
    training_args = TrainingArguments(
        output_dir=str(args.out / "trainer"), max_steps=10 if args.quick else args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=0.5, max_grad_norm=0.0,
        report_to=[], save_strategy="no", disable_tqdm=True, logging_strategy="no",
    )
    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_set,
        optimizers=(dp_optimizer, None), callbacks=[HFPrivacyCallback(monitor)],
    )
    trainer.train()
    final = monitor.finish()
    print(f"{engine.accountant.num_steps} steps; last record: {final}")
    if monitor.stop_reason:
        print(f"stopped: {monitor.stop_reason}")
    print(f"per-step log: {log}")


if __name__ == "__main__":
    main()
