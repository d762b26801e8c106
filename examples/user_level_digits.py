"""User-level DP-SGD on scikit-learn's digits: users sampled, each user's records clipped together.

The training records are split into users who own between 1 and ``2 * --records-per-user - 1``
records each (a stand-in for the people behind the records). Each step samples *users*
(``--sampling poisson``: each user independently with probability q; ``shuffled``: a fresh
permutation of the users each epoch), and each sampled user's records form one contribution:
the gradient of the user's loss (``--reduction sum`` or ``mean`` over its records) is clipped
to C by Opacus as one per-sample gradient, because
:class:`~opacus_lastiterate.user_samplers.UserDataset` stacks a user's records into one batch
element and the MLP keeps the records' dimension (``docs/privacy_units.md``, "User-level
sampling").

The accountant detects the scheme over users and the unit "user-level sampling": every epsilon
printed (through a ``PrivacyMonitor``, one row per step) protects a *user*, all its records at
once, and is the record-level formula for a dataset of U users. The heuristic epsilon is exact
only for linear losses and covers the final model only; the standard epsilon is a DP
guarantee. Two kinds of canary users end the run with the in-training one-run audit of the
final model: ``--canaries M`` adds M gradient canaries of norm C, each sampled like a user (a
user's clipped contribution is one vector of norm at most C, so a canary user is one such
vector); ``--canary-users M`` adds M input-space canary users, each owning
``--canary-records`` held-out images that share one secret, a label drawn at random, added to
the training users or left out together by a fair coin, and scored by minus the final model's
summed loss on them (the package's ``make_canary_users`` builds them).

``python examples/user_level_digits.py --quick`` takes a few seconds; the data ship with
scikit-learn (no download).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from opacus import PrivacyEngine
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.auditing.input_space import InputCanaries, make_canary_users
from opacus_lastiterate.callbacks import (
    LABELS,
    EpsilonRecord,
    InTrainingCanaryAudit,
    PrivacyMonitor,
)
from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning
from opacus_lastiterate.user_samplers import UserDataset, per_user_loss, user_data_loader


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--epochs", type=int, default=5, help="training epochs")
    parser.add_argument("--users-per-step", type=int, default=32, help="(expected) users per step")
    parser.add_argument(
        "--records-per-user", type=int, default=4, help="mean number of records of a user"
    )
    parser.add_argument(
        "--max-records", type=int, default=8, help="records of a user used at most (a cap)"
    )
    parser.add_argument("--sampling", choices=["poisson", "shuffled"], default="poisson")
    parser.add_argument(
        "--reduction", choices=["sum", "mean"], default="mean",
        help="a user's loss: the sum or the mean of its records' losses",
    )
    parser.add_argument("--sigma", type=float, default=1.0, help="noise multiplier")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (no momentum)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta")
    parser.add_argument("--standard-every", type=int, default=10, help="PLD epsilon every k steps")
    parser.add_argument(
        "--canaries", type=int, default=0, metavar="M", help="gradient canary users"
    )
    parser.add_argument(
        "--canary-users", type=int, default=0, metavar="M", help="input-space canary users"
    )
    parser.add_argument(
        "--canary-records", type=int, default=4, metavar="K",
        help="records of each input-space canary user (sharing one secret label)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, users and torch")
    parser.add_argument("--quick", action="store_true", help="one epoch (overrides --epochs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 1
    for name in ("epochs", "users_per_step", "records_per_user", "max_records", "hidden",
                 "standard_every", "canary_records"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    for name in ("canaries", "canary_users"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}.")
    if args.canary_users and args.canary_records > args.max_records:
        parser.error("--canary-records must be at most --max-records.")
    return args


def load_users(
    records_per_user: int, max_records: int, seed: int, canary_users: int, canary_records: int
) -> tuple[UserDataset, TensorDataset, InputCanaries | None]:
    """The digits' training records grouped into users (sizes 1 .. 2 * mean - 1, uniform), the
    held-out records, and the input-space canary users (None without them).

    Pixels are scaled by their known range [0, 16] to [-1, 1]. A canary user owns
    ``canary_records`` held-out images (not otherwise in training, and left out of the
    held-out records) sharing one label drawn uniformly, its secret; a fair coin adds the user
    to the training users or leaves it out. ``make_canary_users`` builds them and their
    record, which scores a canary user by minus the final model's summed loss on its records.
    """
    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32) / 8.0 - 1.0
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < len(x_train):
        sizes.append(int(rng.integers(1, 2 * records_per_user)))
    owner = np.repeat(np.arange(len(sizes)), sizes)[: len(x_train)]
    rng.shuffle(owner)  # who owns which record: random
    train = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train.astype(np.int64)))
    held_out = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test.astype(np.int64)))
    if not canary_users:
        return UserDataset(train, owner.tolist(), max_records=max_records), held_out, None
    used = canary_users * canary_records
    if used >= len(x_test):
        raise SystemExit(f"--canary-users x --canary-records must be below {len(x_test)}.")
    order = rng.permutation(len(x_test))
    users, canaries = make_canary_users(
        train,
        owner.tolist(),
        held_out,
        order[:used].reshape(canary_users, canary_records),
        num_classes=10,
        seed=seed,
        reduction="sum",  # a user's score: minus its summed loss
        max_records=max_records,
    )
    kept = torch.from_numpy(order[used:])
    test = TensorDataset(held_out.tensors[0][kept], held_out.tensors[1][kept])
    return users, test, canaries


def build_model(hidden: int) -> nn.Module:
    """A two-layer MLP (64 -> hidden -> 10) applied to the last dimension: on a batch of
    users ``(users, records, 64)`` Opacus's per-sample gradient is then per user."""
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def users_loss(model: nn.Module, x, y, mask, reduction: str) -> torch.Tensor:
    """The mean over the batch's users of each user's loss (sum or mean over its records)."""
    logits = model(x)
    losses = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"
    ).reshape(y.shape)
    per_user = per_user_loss(losses, mask, reduction=reduction)
    return per_user.mean() if per_user.numel() else logits.sum() * 0.0


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset) -> float:
    """Fraction of correctly classified held-out records."""
    x, y = data.tensors
    return float((model(x).argmax(dim=1) == y).float().mean())


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def print_row(r: EpsilonRecord) -> None:
    """The monitor's sink: one row per step."""
    print(
        f"{r.step:>6} {_fmt(r.heuristic_epsilon):>14} {_fmt(r.opacus_rdp_epsilon):>12} "
        f"{_fmt(r.standard_epsilon):>12}" + ("  (final)" if r.final else ""),
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Train at user level, print the epsilons of a user after every step, then accuracy."""
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Optimal order is the")
    torch.manual_seed(args.seed)
    users, test_set, canary_users = load_users(
        args.records_per_user, args.max_records, args.seed, args.canary_users,
        args.canary_records,
    )
    if args.users_per_step > users.num_users:
        print(f"--users-per-step must be at most {users.num_users}", file=sys.stderr)
        return 2
    loader = user_data_loader(
        users,
        users_per_step=args.users_per_step,
        sampling=args.sampling,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = build_model(args.hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        data_loader=loader,
        noise_multiplier=args.sigma,
        max_grad_norm=args.max_grad_norm,
        poisson_sampling=False,  # keep the loader over users (Poisson or shuffled)
    )
    accountant = engine.accountant
    sample_rate = 1 / len(loader)
    records = len(users.dataset) - users.dropped_records
    print(
        f"digits: {users.num_users} users own {records} training records (at most "
        f"{users.max_records} each; {users.dropped_records} beyond the cap unused); "
        f"{len(test_set)} test records"
    )
    scheme = accountant.sampling.describe() if accountant.sampling else "Poisson sampling"
    print(
        f"unit: {accountant.unit.label()} ({accountant.unit.describe()}); scheme, over "
        f"users (a record of the scheme is a user): {scheme}; "
        f"q=1/{len(loader)}={sample_rate:.4f}, sigma={args.sigma}, C={args.max_grad_norm}, "
        f"{args.epochs * len(loader)} steps, delta={args.delta:g}"
    )
    print(f"columns: eps_heuristic = {LABELS['heuristic_epsilon']}")
    print(f"         eps_std_rdp   = {LABELS['opacus_rdp_epsilon']}")
    print(f"         eps_std_pld   = {LABELS['standard_epsilon']}, every {args.standard_every} steps")
    print("every epsilon protects one user (all its records)")
    print(f"{'step':>6} {'eps_heuristic':>14} {'eps_std_rdp':>12} {'eps_std_pld':>12}")

    audit = None
    if args.canaries or canary_users is not None:
        audit = InTrainingCanaryAudit(
            optimizer,
            num_canaries=args.canaries,  # one clipped contribution of norm C each, as users
            sample_rate=sample_rate,
            seed=args.seed + 1,
            accountant=accountant,
            input_canaries=canary_users,  # already among the training users by their coins
        )
    monitor = PrivacyMonitor(
        engine,
        delta=args.delta,
        sinks=[print_row],
        robust_every=10**9,
        standard_every=args.standard_every,
        optimizer=optimizer,
    )
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonMonotoneHeuristicWarning)
        for _ in range(args.epochs):
            for x, y, mask in loader:
                optimizer.zero_grad()
                users_loss(model, x, y, mask, args.reduction).backward()
                optimizer.step()  # the accountant records the step; the monitor prints a row
        final = monitor.finish()
    elapsed = time.perf_counter() - start
    assert final is not None
    print(f"\nafter {final.step} steps, for one user at delta={args.delta:g}:")
    print(f"  epsilon {final.heuristic_epsilon:.4f}  ({LABELS['heuristic_epsilon']})")
    print(f"  epsilon {final.standard_epsilon:.4f}  ({LABELS['standard_epsilon']})")
    print(f"test accuracy: {accuracy(model, test_set):.4f}")
    print(f"time: {elapsed:.1f} s (training with the monitor)")
    if audit is not None:
        print("\nin-training audit of the final model (one run, canary users):")
        print(audit.report(delta=args.delta, model=model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
