"""Cost of a PrivacyMonitor recording every step of an AdamW run with shuffled batches.

The setting of ``examples/language_model_lora.py --compare``: Opacus ``make_private`` with
``poisson_sampling=False`` (shuffled batches in epochs), ``torch.optim.AdamW`` with a
linear warm-up and decay of the learning rate (``LambdaLR``), and
``PrivacyMonitor(engine, heuristic_every=1, weighted_every=1, standard_every=...)``
attached to the DP optimizer, on a small MLP (``--width``) so that the monitor's CPU work
is not hidden behind the model. Each repeat trains ``--steps`` steps without and with the
monitor (the monitor's evaluations in the loop, its last ``flush()`` included; the final
``finish()`` is timed apart) and the ratio is with / without, end to end as the user pays
it. Times: CPU seconds of the training thread (``time.thread_time``) on the CPU,
wall-clock seconds after ``torch.cuda.synchronize()`` with ``--device cuda``. Also prints
the monitor's ms per step over steps 0-100, 100-200 and 200-300 (it should not grow like
the step number). ``--optimizer sgd``: SGD momentum 0.9 with a cosine schedule instead.

    python benchmarks/bench_monitor_adamw.py                       # AdamW, standard_every=1
    python benchmarks/bench_monitor_adamw.py --standard-every auto
    python benchmarks/bench_monitor_adamw.py --optimizer sgd --device cuda
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import warnings

import torch
from opacus import PrivacyEngine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers "last_iterate")
from opacus_lastiterate.callbacks import PrivacyMonitor


def _clock(device: torch.device):
    if device.type == "cuda":
        def clock() -> float:
            torch.cuda.synchronize()
            return time.perf_counter()
        return clock
    return time.thread_time


def train(args: argparse.Namespace, monitored: bool) -> tuple[float, list[float], float]:
    """(seconds of the loop, seconds of each step, seconds of ``finish()``)."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    clock = _clock(device)
    data = TensorDataset(torch.randn(args.n, 16), torch.randint(0, 4, (args.n,)))
    model = nn.Sequential(nn.Linear(16, args.width), nn.ReLU(), nn.Linear(args.width, 4)).to(device)
    steps = args.steps
    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer,
        data_loader=DataLoader(data, batch_size=args.batch_size, shuffle=True),
        noise_multiplier=args.sigma, max_grad_norm=1.0, poisson_sampling=False,
    )
    warm = max(1, steps // 10)
    if args.optimizer == "adamw":  # the Trainer's linear warm-up and decay
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
    else:
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    monitor = None
    if monitored:
        standard = args.standard_every if args.standard_every == "auto" else int(args.standard_every)
        monitor = PrivacyMonitor(engine, delta=1e-5, heuristic_every=1, weighted_every=1,
                                 standard_every=standard).attach(optimizer, model)
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []
    start = clock()
    while len(times) < steps:
        for x, y in loader:
            if len(times) >= steps:
                break
            t = clock()
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            optimizer.step()
            schedule.step()
            times.append(clock() - t)
    if monitor is not None:
        t = clock()
        monitor.flush()
        times[-1] += clock() - t
    total = clock() - start
    finish = 0.0
    if monitor is not None:
        t = clock()
        monitor.finish()
        finish = clock() - t
    return total, times, finish


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--standard-every", default="1", help="an int or auto")
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # the monitor's one-off warnings (e.g. the heuristic's)
    train(args, False)  # warm-up: imports, allocations
    ratios, per_step, thirds, finishes = [], [], [], []
    for _ in range(args.repeats):
        base, base_steps, _ = train(args, False)
        total, steps, finish = train(args, True)
        ratios.append(total / base)
        per_step.append((total - base) / args.steps * 1e3)
        edges = [0, args.steps // 3, 2 * args.steps // 3, args.steps]
        thirds.append([1e3 * (sum(steps[a:b]) - sum(base_steps[a:b])) / (b - a)
                       for a, b in itertools.pairwise(edges)])
        finishes.append(finish)
    print(f"{args.optimizer}, standard_every={args.standard_every}, {args.steps} steps, "
          f"{args.device}, {args.repeats} repeats")
    print(f"ratio with/without monitor: median {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}, {max(ratios):.2f}]")
    print(f"monitor ms/step: median {statistics.median(per_step):.2f} "
          f"[{min(per_step):.2f}, {max(per_step):.2f}]")
    mid = [statistics.median(col) for col in zip(*thirds)]
    print("monitor ms/step by thirds of the run: " + ", ".join(f"{m:.2f}" for m in mid))
    print(f"finish(): median {statistics.median(finishes):.3f} s")


if __name__ == "__main__":
    main()
