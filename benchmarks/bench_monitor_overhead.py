"""Overhead of PrivacyMonitor logging every step, on the examples' model.

Trains the MLP of ``examples/train_digits.py`` (digits, Opacus, Poisson sampling) for
``--steps`` steps without and with a :class:`~opacus_lastiterate.callbacks.PrivacyMonitor`
whose sinks receive a record after every step (heuristic epsilon and RDP standard epsilon
every step; robust and PLD on their cadences, ``--robust-every``/``--standard-every``, and at
the end; ``0`` = only at the end), for plain SGD and for SGD momentum 0.9 with a cosine
learning-rate schedule. Without the monitor the accountant still records every step (that
is Opacus's own hook). Runs alternate (``--repeats`` of each) and the median time of each
configuration is compared; prints the ratio with/without (goal: <= 1.01).

    python benchmarks/bench_monitor_overhead.py                 # 500 steps, 3 repeats
    python benchmarks/bench_monitor_overhead.py --steps 2000 --standard-every 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_digits

import opacus_lastiterate.accountants  # noqa: F401
from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyMonitor


def run(
    steps: int, schedule: bool, monitored: bool, args: argparse.Namespace
) -> tuple[float, float]:
    """Seconds for ``steps`` training steps (data loading included) after 5 warm-up steps,
    and seconds of ``monitor.finish()`` (robust and PLD epsilon at the end)."""
    torch.manual_seed(0)
    train_set, _ = train_digits.load_data(0.2, 0)
    model = train_digits.build_model(64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9 if schedule else 0.0)
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(train_set, batch_size=64),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=True,
    )
    scheduler = (
        torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps + 5) if schedule else None
    )
    records: list[EpsilonRecord] = []
    monitor = None
    if monitored:
        monitor = PrivacyMonitor(
            engine, delta=1e-5, sinks=[records.append], optimizer=optimizer,
            robust_every=args.robust_every or None, standard_every=args.standard_every or None,
        )
    criterion = nn.CrossEntropyLoss()
    done, start = 0, 0.0
    while done < steps + 5:
        for x, y in loader:
            if done == 5:
                start = time.perf_counter()
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            done += 1
            if done == steps + 5:
                break
    elapsed = time.perf_counter() - start
    finish = 0.0
    if monitor is not None:
        t0 = time.perf_counter()
        monitor.finish()
        finish = time.perf_counter() - t0
        assert len(records) == steps + 5 + 1
    return elapsed, finish


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--robust-every", type=int, default=0)
    parser.add_argument("--standard-every", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(
        f"digits MLP, {args.steps} steps, median of {args.repeats} alternating runs; monitor "
        f"records every step (robust every {args.robust_every or 'end'}, PLD every "
        f"{args.standard_every or 'end'}; finish() timed apart)"
    )
    for name, schedule in (("plain SGD", False), ("SGD momentum 0.9 + cosine", True)):
        times: dict[bool, list[float]] = {False: [], True: []}
        finishes: list[float] = []
        for _ in range(args.repeats):
            for monitored in (False, True):
                elapsed, finish = run(args.steps, schedule, monitored, args)
                times[monitored].append(elapsed)
                if monitored:
                    finishes.append(finish)
        base, mon = statistics.median(times[False]), statistics.median(times[True])
        print(
            f"{name:<28} without {base:7.3f} s  with {mon:7.3f} s  "
            f"({1e3 * (mon - base) / args.steps:6.3f} ms/step)  ratio {mon / base:.4f}  "
            f"finish() {statistics.median(finishes):.3f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
