"""DP-SGD on scikit-learn's digits with an in-training canary audit of the final model.

One training run (Opacus, last-iterate accountant) carries two kinds of canaries, each
included by a recorded fair coin (``docs/auditing.md``, "In-training audit"):

* gradient canaries: Dirac gradients of norm C on distinct parameter coordinates, added to
  the clipped gradient sum before the noise, Poisson-sampled at the training rate;
* input canaries: mislabelled copies of held-out digits added to the training set.

At the end every canary is scored on the final model only, and the one-run lower bounds
(Steinke, Nasr, Jagielski, arXiv 2305.08846; Mahloujifar, Melis, Chaudhuri, arXiv
2410.22235) are printed beside the heuristic and standard epsilons at the same delta.

Run ``python examples/in_training_audit.py --help``; ``--quick`` takes a few seconds. The
data ship with scikit-learn (no download).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.auditing.input_space import make_input_canaries
from opacus_lastiterate.callbacks import InTrainingCanaryAudit


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--epochs", type=int, default=20, help="training epochs")
    parser.add_argument("--batch-size", type=int, default=64, help="expected batch size")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (no momentum)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta")
    parser.add_argument("--confidence", type=float, default=0.95, help="confidence per audit")
    parser.add_argument(
        "--gradient-canaries", type=int, default=1000, help="m gradient canaries (0: none)"
    )
    parser.add_argument(
        "--input-canaries", type=int, default=300, help="m input canaries (0: none)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of split, torch and canaries")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to train (cuda if available)",
    )
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="also write the report as JSON"
    )
    parser.add_argument(
        "--quick", action="store_true", help="2 epochs and fewer canaries, for CI"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 2
        args.gradient_canaries = min(args.gradient_canaries, 200)
        args.input_canaries = min(args.input_canaries, 100)
    for name in ("epochs", "batch_size", "hidden"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    for name in ("gradient_canaries", "input_canaries"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was requested but CUDA is not available.")
    return args


def load_data(seed: int, pool: int) -> tuple[TensorDataset, TensorDataset, TensorDataset]:
    """Train, test and canary-source splits of digits, scaled to [-1, 1] by the known range.

    The canary source is disjoint from the training set: a mislabelled copy of a training
    example would leave the original in the data whatever the canary's coin.
    """
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32) / 8.0 - 1.0
    y = y.astype(np.int64)
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=0.15, random_state=seed, stratify=y
    )
    if pool > 0:
        x_train, x_pool, y_train, y_pool = train_test_split(
            x_rest, y_rest, test_size=pool, random_state=seed
        )
    else:
        x_train, y_train = x_rest, y_rest
        x_pool, y_pool = x_rest[:0], y_rest[:0]

    def to_dataset(features: np.ndarray, labels: np.ndarray) -> TensorDataset:
        return TensorDataset(torch.from_numpy(features), torch.from_numpy(labels))

    return to_dataset(x_train, y_train), to_dataset(x_test, y_test), to_dataset(x_pool, y_pool)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    """Fraction of correctly classified examples."""
    x, y = data.tensors
    model.eval()
    correct = int((model(x.to(device)).argmax(dim=1) == y.to(device)).sum())
    model.train()
    return correct / len(y)


def main(argv: Sequence[str] | None = None) -> int:
    """Train with canaries, then print the one-run audit beside the epsilons."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    train_set, test_set, pool = load_data(args.seed, args.input_canaries)
    input_canaries = None
    data = train_set
    if args.input_canaries > 0:
        data, input_canaries = make_input_canaries(
            train_set, pool, args.input_canaries, num_classes=10, seed=args.seed
        )
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    model = model.to(device)
    engine = PrivacyEngine(accountant="last_iterate")
    private, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=args.lr),
        data_loader=DataLoader(data, batch_size=args.batch_size),
        noise_multiplier=args.sigma,
        max_grad_norm=args.max_grad_norm,
        poisson_sampling=True,
    )
    audit = InTrainingCanaryAudit(
        optimizer,
        num_canaries=args.gradient_canaries,
        sample_rate=1 / len(loader),
        seed=args.seed,
        accountant=engine.accountant,
        input_canaries=input_canaries,
    )
    print(
        f"digits: {len(train_set)} training examples + "
        f"{0 if input_canaries is None else int(input_canaries.included.sum())} input canaries "
        f"(of {args.input_canaries}); {args.gradient_canaries} gradient canaries; "
        f"sigma={args.sigma}, q=1/{len(loader)}, C={args.max_grad_norm}, "
        f"{args.epochs} epochs, device={device}"
    )

    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            criterion(private(x.to(device)), y.to(device)).backward()
            optimizer.step()
    seconds = time.perf_counter() - start

    report = audit.report(delta=args.delta, confidence=args.confidence, model=model)
    print(report)
    print(f"test accuracy: {accuracy(model, test_set, device):.4f}; training {seconds:.1f} s")
    print(
        "The bounds are lower bounds on the epsilon of the canaries, i.e. of records in the "
        "worst position the attack can find; a small bound does not show that little leaks."
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
