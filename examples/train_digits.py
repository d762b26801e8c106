"""DP-SGD on scikit-learn's digits with the last-iterate accountant.

Trains a small MLP with Opacus (Poisson sampling, per-example clipping, Gaussian noise) and
prints, after every step, through a ``PrivacyMonitor`` (``opacus_lastiterate.callbacks``)
rather than a hand-written loop, these epsilons at the same delta:

* the **last-iterate heuristic** (Steinke et al., "The Last Iterate Advantage", ICLR 2025,
  arXiv 2410.06186; ``docs/last_iterate.md``): the privacy of the *final model only*, exact
  for linear losses and a heuristic otherwise. It is **not** a differential-privacy
  guarantee for this (non-linear) network.
* its **robust** variant (certified max over the last t <= T steps), every
  ``--robust-every`` steps and at the end;
* the **standard** composition epsilon (every iterate released): an RDP upper bound every
  step, and the tight PLD value (dp_accounting) every ``--standard-every`` steps and at the
  end. These are DP guarantees.

``--log-csv``/``--log-jsonl`` append every record to a file (whole lines even if killed).
``--canaries M`` (the demo uses it) adds M gradient canaries to this very run and ends with the
in-training one-run audit of the final model (``docs/auditing.md``, "In-training audit").

Run ``python examples/train_digits.py --help`` for the options; ``--quick`` takes a few
seconds. The data ship with scikit-learn (no download).
"""

from __future__ import annotations

import argparse
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
from opacus_lastiterate.callbacks import (
    LABELS,
    CsvSink,
    EpsilonRecord,
    InTrainingCanaryAudit,
    JsonlSink,
    PrivacyMonitor,
)
from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--epochs", type=int, default=3, help="training epochs")
    parser.add_argument("--batch-size", type=int, default=64, help="expected batch size")
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (no momentum)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta")
    parser.add_argument("--log-every", type=int, default=1, help="print every k steps")
    parser.add_argument(
        "--standard-every",
        type=int,
        default=10,
        help="compute the (slower) tight PLD standard epsilon every k steps, and at the end",
    )
    parser.add_argument(
        "--robust-every",
        type=int,
        default=10,
        help="compute the robust heuristic epsilon every k steps, and at the end",
    )
    parser.add_argument("--test-size", type=float, default=0.2, help="held-out fraction")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and of torch")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to train (cuda if available)",
    )
    parser.add_argument(
        "--log-csv",
        type=Path,
        default=None,
        metavar="PATH",
        help="also append every record (all epsilons, lr, sigma, q) to this CSV file",
    )
    parser.add_argument(
        "--log-jsonl", type=Path, default=None, metavar="PATH", help="the same as JSON lines"
    )
    parser.add_argument(
        "--canaries",
        type=int,
        default=0,
        metavar="M",
        help="add M gradient canaries and end with the in-training audit (0: none)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="one epoch (overrides --epochs), for CI"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 1
    for name in ("epochs", "batch_size", "hidden", "log_every", "standard_every", "robust_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.canaries < 0:
        parser.error(f"--canaries must be >= 0, got {args.canaries}.")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was requested but CUDA is not available.")
    return args


def load_data(test_size: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """Digits (8x8 images, 10 classes), split and scaled to [-1, 1].

    Pixels lie in [0, 16]; we scale by that known range rather than fitting a StandardScaler,
    whose mean and scale would be computed from private training data outside the accounting.
    """
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_size, random_state=seed, stratify=y
    )

    def to_dataset(features: np.ndarray, labels: np.ndarray) -> TensorDataset:
        scaled = features.astype(np.float32) / 8.0 - 1.0
        return TensorDataset(torch.from_numpy(scaled), torch.from_numpy(labels.astype(np.int64)))

    return to_dataset(x_train, y_train), to_dataset(x_test, y_test)


def build_model(hidden: int) -> nn.Module:
    """A two-layer MLP (64 -> hidden -> 10)."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


@torch.no_grad()
def accuracy(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """Fraction of correctly classified examples."""
    model.eval()
    correct = total = 0
    for x, y in loader:
        pred = model(x.to(device)).argmax(dim=1)
        correct += int((pred == y.to(device)).sum())
        total += len(y)
    model.train()
    return correct / total


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


class TablePrinter:
    """A monitor sink that prints one table row per record (every ``every`` steps)."""

    HEADER = (
        f"{'step':>6} {'eps_heuristic':>14} {'eps_robust':>11} {'eps_std_rdp':>12} "
        f"{'eps_std_pld':>12}"
    )

    def __init__(self, every: int) -> None:
        self.every = every

    def __call__(self, r: EpsilonRecord) -> None:
        if r.final or r.step % self.every == 0 or r.robust_heuristic_epsilon is not None:
            print(
                f"{r.step:>6} {_fmt(r.heuristic_epsilon):>14} {_fmt(r.robust_heuristic_epsilon):>11} "
                f"{_fmt(r.opacus_rdp_epsilon):>12} {_fmt(r.standard_epsilon):>12}"
                + ("  (final)" if r.final else ""),
                flush=True,
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Train, print the epsilons after every step through the monitor, report accuracy."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)

    train_set, test_set = load_data(args.test_size, args.seed)
    model = build_model(args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    train_loader = DataLoader(train_set, batch_size=args.batch_size)
    test_loader = DataLoader(test_set, batch_size=512)

    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, train_loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=train_loader,
        noise_multiplier=args.sigma,
        max_grad_norm=args.max_grad_norm,
        poisson_sampling=True,
    )
    sample_rate = 1 / len(train_loader)
    total_steps = args.epochs * len(train_loader)
    print(
        f"digits: {len(train_set)} train / {len(test_set)} test examples; sigma={args.sigma}, "
        f"q=1/{len(train_loader)}={sample_rate:.4f}, C={args.max_grad_norm}, "
        f"{total_steps} steps, delta={args.delta:g}, device={device}"
    )
    print(
        "The heuristic epsilon is exact only for linear losses; for this network it is NOT a "
        "DP guarantee, and it covers the final model only."
    )
    print(f"columns: eps_heuristic = {LABELS['heuristic_epsilon']}")
    print(f"         eps_robust    = {LABELS['robust_heuristic_epsilon']}, every {args.robust_every} steps")
    print(f"         eps_std_rdp   = {LABELS['opacus_rdp_epsilon']}")
    print(
        f"         eps_std_pld   = {LABELS['standard_epsilon']}, every "
        f"{args.standard_every} steps"
    )
    print(TablePrinter.HEADER)

    sinks: list = [TablePrinter(args.log_every)]
    if args.log_csv is not None:
        sinks.append(CsvSink(args.log_csv))
    if args.log_jsonl is not None:
        sinks.append(JsonlSink(args.log_jsonl))
    audit = None
    if args.canaries:  # gradient canaries on distinct coordinates, recorded fair coins
        audit = InTrainingCanaryAudit(
            optimizer,
            num_canaries=args.canaries,
            sample_rate=sample_rate,
            seed=args.seed + 1,
            accountant=engine.accountant,
        )
    monitor = PrivacyMonitor(
        engine,
        delta=args.delta,
        sinks=sinks,
        robust_every=args.robust_every,
        standard_every=args.standard_every,
        optimizer=optimizer,
    )

    criterion = nn.CrossEntropyLoss()
    start = time.perf_counter()
    # The heuristic of a few steps can exceed that of more (it is not monotone in T); the
    # monitor warns, and the eps_robust column is the answer. Said once below the table,
    # where it is true of the final model, instead of as a warning above the table.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NonMonotoneHeuristicWarning)
        for _ in range(args.epochs):
            for x, y in train_loader:
                optimizer.zero_grad()
                loss = criterion(model(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()  # the accountant records the step; the monitor prints a row
        final = monitor.finish()
    for w in caught:
        if not issubclass(w.category, NonMonotoneHeuristicWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    dipped = any(issubclass(w.category, NonMonotoneHeuristicWarning) for w in caught)
    elapsed = time.perf_counter() - start

    test_acc = accuracy(model, test_loader, device)
    assert final is not None
    print(f"\nafter {final.step} steps at delta={args.delta:g}:")
    print(f"  epsilon {final.heuristic_epsilon:.4f}  ({LABELS['heuristic_epsilon']})")
    print(f"  epsilon {final.robust_heuristic_epsilon:.4f}  ({LABELS['robust_heuristic_epsilon']})")
    print(f"  epsilon {final.standard_epsilon:.4f}  ({LABELS['standard_epsilon']})")
    print(f"  epsilon {final.opacus_rdp_epsilon:.4f}  ({LABELS['opacus_rdp_epsilon']})")
    if final.robust_heuristic_epsilon is not None and (
            final.robust_heuristic_epsilon > final.heuristic_epsilon):
        print("  note: the final heuristic is below its maximum over the last t <= T steps "
              "(not monotone); report the robust value")
    elif dipped:
        print("  note: the heuristic dipped below eps_robust at early steps only (not "
              "monotone in T); at the final step the two agree")
    print(f"test accuracy: {test_acc:.4f}")
    print(f"time: {elapsed:.1f} s (training with the monitor)")
    if audit is not None:
        print("\nin-training audit of the final model (one run, gradient canaries):")
        print(audit.report(delta=args.delta))
    for path in (args.log_csv, args.log_jsonl):
        if path is not None:
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
