"""Overhead of PrivacyMonitor logging every step, on the examples' model.

Trains the MLP of ``examples/train_digits.py`` (digits, Opacus, Poisson sampling) for
``--steps`` steps without and with a :class:`~opacus_lastiterate.callbacks.PrivacyMonitor`
that records every step, for plain SGD and for SGD momentum 0.9 with a cosine learning-rate
schedule. Without the monitor the accountant still records every step (Opacus's own hook).
Times are CPU seconds of the training thread (``time.thread_time``: the machine is shared)
on the CPU, and wall-clock seconds between two ``torch.cuda.synchronize()`` with
``--device cuda`` (the batches are moved to the GPU inside the timed loop), after 5 warm-up
steps; each repeat runs every variant once, in turn, and a ratio is the
median [and range] over the repeats of that repeat's run against its run without the monitor.
Three figures per optimizer:

* ``hot path``: the training loop with the monitor queueing every step and evaluating
  nothing in the loop (``flush_every=None``); the ratio with/without is the per-step cost
  of monitoring on the training hot path (goal: <= 1.01);
* ``evaluation``: ``monitor.flush()`` of that run: the records of all steps computed in
  one batch (heuristic every step for plain SGD, every ``--weighted-every`` steps under
  momentum + cosine; RDP standard epsilon every step), per step;
* ``in loop``: the loop with the default ``flush_every=100`` (evaluation inside the loop)
  plus the last ``flush()``, against the loop without the monitor: the whole per-step cost.
  The final record of ``finish()`` (robust and PLD epsilon, once per run) is not timed.
  The robust and PLD epsilons are off in these three figures (``None``); three more "in
  loop" ratios add them on the default cadence (``"auto"``: the doubling steps that fit in
  1% of the training time; how many of them carried a PLD value is printed), on the
  ``"doubling"`` cadence (steps 100, 200, 400) and every 100 steps;
* ``in loop, wall clock``: the "in loop" run in wall-clock time (``time.perf_counter``)
  against the loop without the monitor on the same clock.

    python benchmarks/bench_monitor_overhead.py                 # 500 steps, 7 repeats
    python benchmarks/bench_monitor_overhead.py --steps 2000 --weighted-every 1000
    python benchmarks/bench_monitor_overhead.py --device cuda --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_digits

import opacus_lastiterate.accountants  # noqa: F401
from opacus_lastiterate.callbacks import EpsilonRecord, PrivacyMonitor


class Timing(NamedTuple):
    loop: float  # the training loop (CPU seconds, or synchronised wall clock on CUDA)
    flush: float  # the last monitor.flush(), same clock
    wall: float  # wall-clock seconds of both
    pld_records: int  # records before the final one that carry a PLD epsilon


def run(steps: int, schedule: bool, flush_every: int | str | None, args: argparse.Namespace,
        cadence: object = None) -> Timing:
    """``steps`` training steps (data loading included) after 5 warm-up steps, and the last
    ``monitor.flush()``. ``flush_every="off"``: no monitor. ``cadence``: the ``robust_every``
    and ``standard_every`` of the monitor."""
    torch.manual_seed(0)
    train_set, _ = train_digits.load_data(0.2, 0)
    device = torch.device(args.device)
    model = train_digits.build_model(64).to(device)
    clock = _clock(device)
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
    if flush_every != "off":
        monitor = PrivacyMonitor(
            engine, delta=1e-5, sinks=[records.append], optimizer=optimizer,
            flush_every=flush_every,  # type: ignore[arg-type]
            weighted_every=args.weighted_every, robust_every=cadence, standard_every=cadence,
        )
    criterion = nn.CrossEntropyLoss()
    done, start, wall = 0, 0.0, 0.0
    while done < steps + 5:
        for x, y in loader:
            if done == 5:
                start = clock()
                wall = time.perf_counter()
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            criterion(model(x), y).backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            done += 1
            if done == steps + 5:
                break
    elapsed = clock() - start
    finish = 0.0
    if monitor is not None:
        t0 = clock()
        monitor.flush()  # every step's record
        finish = clock() - t0
    wall = time.perf_counter() - wall
    if monitor is not None:
        monitor.finish()  # the final record (robust, PLD: once per run, not timed)
        assert len(records) == steps + 5 + 1 and [r.step for r in records[:-1]] == list(
            range(1, steps + 6)
        )
    pld_records = sum(r.standard_epsilon is not None for r in records[:-1])
    return Timing(elapsed, finish, wall, pld_records)


def _clock(device: torch.device) -> Callable[[], float]:
    """CPU time of this thread on the CPU; wall-clock time after the GPU's queue is done on
    CUDA (the GPU's work is not this thread's CPU time)."""
    if device.type == "cpu":
        return time.thread_time

    def synchronised() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return synchronised


def _ratio(with_monitor: list[float], without: list[float]) -> str:
    """Median and range of the per-repeat ratios (each run against the run without the
    monitor of the same repeat: slow drifts of a shared machine cancel)."""
    ratios = sorted(a / b for a, b in zip(with_monitor, without, strict=True))
    return f"{statistics.median(ratios):.4f} [{ratios[0]:.3f}-{ratios[-1]:.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--weighted-every", type=int, default=100)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was requested but CUDA is not available.")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    clock = (
        "CPU time of the training thread" if args.device == "cpu"
        else f"wall clock between CUDA synchronisations on {torch.cuda.get_device_name()}"
    )
    print(
        f"digits MLP, {args.steps} steps, {clock}; ratios: median "
        f"[range] of {args.repeats} repeats; weighted heuristic every {args.weighted_every} steps"
    )
    for name, schedule in (("plain SGD", False), ("SGD momentum 0.9 + cosine", True)):
        times: dict[object, list[float]] = {"off": [], None: [], 100: []}
        finishes: dict[object, list[float]] = {None: [], 100: []}
        cadenced: dict[object, list[float]] = {"auto": [], "doubling": [], 100: []}
        auto_plds: list[int] = []
        walls: dict[object, list[float]] = {"off": [], 100: []}
        for _ in range(args.repeats):
            for flush in ("off", None, 100):
                t = run(args.steps, schedule, flush, args)
                times[flush].append(t.loop)
                if flush != "off":
                    finishes[flush].append(t.flush)
                if flush != None:  # noqa: E711 (a dict key)
                    walls[flush].append(t.wall)
            for cadence in cadenced:
                t = run(args.steps, schedule, 100, args, cadence)
                cadenced[cadence].append(t.loop + t.flush)
                if cadence == "auto":
                    auto_plds.append(t.pld_records)
        n = args.steps
        base = statistics.median(times["off"])
        hot = statistics.median(times[None])
        evaluation = statistics.median(finishes[None])
        in_loop = [t + f for t, f in zip(times[100], finishes[100], strict=True)]
        print(f"{name}:")
        print(
            f"  without monitor {1e3 * base / n:7.3f} ms/step; hot path {1e3 * hot / n:7.3f} "
            f"ms/step, ratio {_ratio(times[None], times['off'])} (goal <= 1.01)"
        )
        print(
            f"  evaluation (batched flush) {1e3 * evaluation / (n + 5):7.3f} ms/step; in loop "
            f"(flush_every=100): ratio {_ratio(in_loop, times['off'])}"
        )
        print(
            "  in loop with robust and PLD epsilon: default cadence (auto) ratio "
            f"{_ratio(cadenced['auto'], times['off'])} ({min(auto_plds)}-{max(auto_plds)} "
            f"intermediate PLD values); doubling ratio {_ratio(cadenced['doubling'], times['off'])}"
            f"; every 100 steps ratio {_ratio(cadenced[100], times['off'])}"
        )
        print(f"  in loop, wall clock (flush_every=100): ratio {_ratio(walls[100], walls['off'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
