"""The weighted heuristic (SGD momentum 0.9, cosine schedule) queried at every step: the
per-query time of each route and of Opacus's accountants, and the monitor's overhead.

Per-query seconds (``time.perf_counter``; a step's append is counted with its query) at
T = 10^3, 10^4, 10^5, sigma 2 (6 at T = 10^5: epsilon about 9.5 as at 10^4, inside the
Fourier routes), q 0.045 (the examples' digits rate), delta 1e-5, accuracy 1e-3, for these
query patterns, each over the last ``n`` steps before T:

* ``all``: a query after each step of the whole run (the median and the largest of all T:
  the grid changes as the run grows, so this is where a rebuild would show);
* ``every``: a query after each step (the steps before: a query every 100 steps);
* ``every10``: a query every 10 steps;
* ``gap``: 1,500 steps without a query, then a query after each step;
* ``load``: the state of an accountant queried every 100 steps (a monitored run's checkpoint)
  loaded into a new accountant, then a query after each step;
* ``load-cold``: the same with an accountant never queried before its state was saved (its
  first query anywhere takes in every step at once).

Routes: ``from scratch`` (a new ``IncrementalCharacteristic`` at each query), ``kept``
(``LastIterateAccountant.get_epsilon``: the characteristic function kept step by step), and
Opacus's ``RDPAccountant`` and ``PRVAccountant`` ``get_epsilon`` at the same (sigma, q, T).
Each line prints the median and the largest query of the kept route and the ratio of the two.

Then the weighted heuristic of every step as the monitor computes it: the steps flushed in
batches of 100 and answered together (``IncrementalWeightedHeuristic.epsilons``), against
asking after each step (``epsilon``): CPU ms per step (``time.process_time``) over the last
640 steps before T (200 with ``--quick``), and the largest relative difference of the two.

Then ``engine.get_epsilon`` after each step of a real Opacus training of a small MLP, after
1,500 unqueried steps, against the training step (median, first and largest query, each a
ratio to its run's median step; median and range over 5 runs, 2 with ``--quick``).

Then the monitor's overhead: a tiny model whose step is padded with a busy-wait to 2 ms and
20 ms (standing in for GPU work), 300 steps without and with a default ``PrivacyMonitor``
(JSONL sink), plain SGD and momentum 0.9 + cosine; the wall-clock ratio is with / without
(median of the repeats), with the monitor's CPU time per step (CPU seconds of this process
and its children, ``resource.getrusage``, with less without, over the steps: a busy-wait
burns CPU only while the process is scheduled, so this is a median of noisy differences)
and the share of records carrying a heuristic value. ``--busy`` runs another process
spinning on a core throughout (a loaded machine).

    python benchmarks/bench_every_step_heuristic.py            # T = 1e3, 1e4, 1e5
    python benchmarks/bench_every_step_heuristic.py --quick    # CI: T = 1e3, 1e4, shorter
    python benchmarks/bench_every_step_heuristic.py --no-queries --step-ms 20 --busy
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.analysis.last_iterate.incremental_fourier import IncrementalCharacteristic
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    SGDSettings,
    cosine_schedule,
)

Q, SIGMA, DELTA, ACC, MOMENTUM, LR = 64 / 1437, 2.0, 1e-5, 1e-3, 0.9, 0.5
SIGMA_AT = {100_000: 6.0}
"""Noise multiplier per T where it is not SIGMA: at T = 10^5 and sigma 2 epsilon is about 20,
where the Fourier routes decline (and the weight grid answers from scratch); sigma 6
keeps epsilon about 9.5, as at T = 10^4 and sigma 2."""
GAP = 1_500
PATTERNS = ("all", "every", "every10", "gap", "load", "load-cold")


def _queried(pattern: str, t: int, total: int, n: int) -> bool:
    """Whether step t (1-based) of a run of ``total`` steps is queried under ``pattern``."""
    if pattern == "all":
        return True
    window = total - (10 * n if pattern == "every10" else n)
    if t > window:
        return pattern != "every10" or t % 10 == 0
    if pattern == "gap" and t > window - GAP:
        return False
    return t % 100 == 0


def _sigma(total: int) -> float:
    return SIGMA_AT.get(total, SIGMA)


def _accountant_route(lrs: np.ndarray, pattern: str, n: int) -> list[float]:
    """Per-query seconds of LastIterateAccountant.get_epsilon (append + query)."""
    acc = LastIterateAccountant(weight_accuracy=ACC)
    total = lrs.size
    times: list[float] = []
    loads = pattern.startswith("load")
    split = total - n if loads else total
    for t in range(1, split + 1):
        settings = SGDSettings(float(lrs[t - 1]), MOMENTUM, 0.0, False, 0.0)
        acc.replay_step(_sigma(total), Q, settings)
        if pattern == "load" and t % 100 == 0:
            acc.get_epsilon(DELTA)
        elif not loads and _queried(pattern, t, total, n):
            t0 = time.perf_counter()
            acc.get_epsilon(DELTA)
            if pattern == "all" or t > total - (10 * n if pattern == "every10" else n):
                times.append(time.perf_counter() - t0)
    if loads:
        state = acc.state_dict()
        acc = LastIterateAccountant(weight_accuracy=ACC)
        acc.load_state_dict(state)
        for t in range(split + 1, total + 1):
            settings = SGDSettings(float(lrs[t - 1]), MOMENTUM, 0.0, False, 0.0)
            t0 = time.perf_counter()
            acc.replay_step(_sigma(total), Q, settings)
            acc.get_epsilon(DELTA)
            times.append(time.perf_counter() - t0)
    return times


def _from_scratch(lrs: np.ndarray, n: int) -> list[float]:
    times = []
    for t in range(lrs.size - min(n, 5) + 1, lrs.size + 1):  # each query is independent
        eta, sigma, q = lrs[:t].tolist(), [_sigma(lrs.size)] * t, [Q] * t
        t0 = time.perf_counter()
        IncrementalCharacteristic(MOMENTUM, 0.0, False).solve(DELTA, eta, sigma, q, ACC)
        times.append(time.perf_counter() - t0)
    return times


def _opacus(steps: int) -> tuple[float, float]:
    from opacus.accountants import PRVAccountant, RDPAccountant

    out = []
    for cls in (RDPAccountant, PRVAccountant):
        acc = cls()
        acc.history = [(_sigma(steps), Q, steps)]
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            acc.get_epsilon(DELTA)
            ts.append(time.perf_counter() - t0)
        out.append(min(ts))
    return out[0], out[1]


def batch_table(steps: list[int], n: int, batch: int = 100) -> None:
    """CPU ms per step of the weighted heuristic of every step: flushed batches answered
    together against a query after each step (both engines asked every 100 steps before)."""
    from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
        IncrementalWeightedHeuristic,
    )

    print(f"\nweighted heuristic of every step, last {n} steps before T, CPU ms per step "
          f"(process_time), batches of {batch} against a query after each step")  # fmt: skip
    for total in steps:
        lrs, sigma = cosine_schedule(LR, total), _sigma(total)
        engines = [IncrementalWeightedHeuristic(ACC) for _ in range(2)]
        for engine in engines:
            for t in range(total - n):
                engine.append(sigma, Q, float(lrs[t]), MOMENTUM)
                if (t + 1) % 100 == 0:
                    engine.epsilon(DELTA)
        one, many = engines
        t0 = time.process_time()
        single = []
        for t in range(total - n, total):
            one.append(sigma, Q, float(lrs[t]), MOMENTUM)
            single.append(one.epsilon(DELTA).epsilon)
        t1 = time.process_time()
        batched: list[float] = []
        for start in range(total - n, total, batch):
            stop = min(start + batch, total)
            for t in range(start, stop):
                many.append(sigma, Q, float(lrs[t]), MOMENTUM)
            batched += [r.epsilon if r else float("nan") for r in many.epsilons(DELTA, stop - start)]
        t2 = time.process_time()
        diff = max(abs(a - b) / b for a, b in zip(batched, single, strict=True))
        print(f"  T = {total:>7}: each step {_ms((t1 - t0) / n)}, batched {_ms((t2 - t1) / n)} "
              f"ms/step, largest relative difference {diff:.1e}")  # fmt: skip
        sys.stdout.flush()


def _ms(x: float) -> str:
    return f"{1e3 * x:8.3f}"


def query_table(steps: list[int], n: int, repeats: int = 1) -> None:
    print(f"per-query ms (median / max; each query the least of {repeats} runs of its pattern: "
          "the computation is deterministic, a shared machine only adds time), "
          f"momentum {MOMENTUM} + cosine, sigma {SIGMA} "
          f"(T = 10^5: {SIGMA_AT[100_000]}), "
          f"q {Q:.4f}, delta {DELTA}, accuracy {ACC}; last {n} queried steps (all: every step)")  # fmt: skip
    print(f"{'T':>7} {'pattern':>8} | {'kept med':>8} {'kept max':>8} | {'scratch':>8} | "
          f"{'RDP':>8} {'PRV':>8} | max/med")  # fmt: skip
    for total in steps:
        lrs = cosine_schedule(LR, total)
        rdp, prv = _opacus(total)
        scratch = statistics.median(_from_scratch(lrs, n))
        for pattern in PATTERNS:
            new = [min(t) for t in zip(*(_accountant_route(lrs, pattern, n)
                                         for _ in range(repeats)))]  # fmt: skip
            med = statistics.median(new)
            print(f"{total:>7} {pattern:>8} | {_ms(med)} {_ms(max(new))} | {_ms(scratch)} | "
                  f"{_ms(rdp)} {_ms(prv)} | {max(new) / med:6.1f}")  # fmt: skip
        sys.stdout.flush()


# -- the monitor's overhead -------------------------------------------------------------------


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _private_mlp(features: int, hidden: int, classes: int, momentum: float):
    """(engine, model, optimizer, loader): an MLP on random data (1,437 records, batch 64)
    made private with ``PrivacyEngine(accountant="last_iterate")``, sigma SIGMA, lr LR."""
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(1437, features), torch.randint(0, classes, (1437,)))
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, opt, loader = engine.make_private(
            module=model, optimizer=opt, data_loader=DataLoader(data, batch_size=64),
            noise_multiplier=SIGMA, max_grad_norm=1.0,
        )  # fmt: skip
    return engine, model, opt, loader


def _train(steps: int, step_s: float, schedule: bool, monitored: bool, log: Path | None):
    import torch
    from torch import nn

    from opacus_lastiterate.callbacks import JsonlSink, PrivacyMonitor

    engine, model, opt, loader = _private_mlp(16, 32, 4, MOMENTUM if schedule else 0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps) if schedule else None
    monitor = None
    if monitored:
        sinks = [JsonlSink(log)] if log is not None else []
        monitor = PrivacyMonitor(engine, delta=DELTA, sinks=sinks, optimizer=opt)
    loss_fn = nn.CrossEntropyLoss()
    done = 0
    t0, cpu0 = time.perf_counter(), _cpu()
    while done < steps:
        for x, y in loader:
            if done == steps:
                break
            t_step = time.perf_counter()
            opt.zero_grad()
            if len(x):
                loss_fn(model(x), y).backward()
            _busy(step_s - (time.perf_counter() - t_step))  # the rest of a step_s step
            opt.step()
            if sched is not None:
                sched.step()
            done += 1
    if monitor is not None:
        monitor.flush()  # every step's record computed
    elapsed = time.perf_counter() - t0
    if monitor is not None:
        monitor.finish()
    return elapsed, _cpu() - cpu0


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _spin() -> None:
    while True:
        pass


def overhead_table(
    steps: int, repeats: int, step_ms: tuple[float, ...] = (2.0, 20.0), busy: bool = False
) -> None:
    print(f"\nmonitor overhead, {steps} steps, default PrivacyMonitor with a JSONL sink "
          "(wall clock, with / without, median [range] of repeats; the monitor's CPU ms per "
          "step, all processes; share of rows with a heuristic)"
          + (", another process spinning on a core" if busy else ""))  # fmt: skip
    warnings.simplefilter("ignore")  # Opacus's secure-RNG and backward-hook notices
    spinner = None
    if busy:
        spinner = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
        spinner.start()
    _train(10, 0.002, True, True, None)  # warm-up: imports, first calls
    for step_s in (ms / 1e3 for ms in step_ms):
        for schedule in (False, True):
            ratios, cpus, share = [], [], 0.0
            for _ in range(repeats):
                base, base_cpu = _train(steps, step_s, schedule, False, None)
                with tempfile.TemporaryDirectory() as tmp:
                    log = Path(tmp, "log.jsonl")
                    mon, mon_cpu = _train(steps, step_s, schedule, True, log)
                    rows = [json.loads(line) for line in log.read_text().splitlines()]
                ratios.append(mon / base)
                cpus.append((mon_cpu - base_cpu) / steps)
                share = sum(r["heuristic_epsilon"] is not None for r in rows) / len(rows)
            name = "momentum+cosine" if schedule else "plain SGD"
            print(f"  {1e3 * step_s:4.0f} ms step, {name:>15}: ratio {statistics.median(ratios):.4f} "
                  f"[{min(ratios):.4f}, {max(ratios):.4f}], monitor CPU "
                  f"{1e3 * statistics.median(cpus):.3f} ms/step, heuristic on "
                  f"{100 * share:.0f}% of rows")  # fmt: skip
            sys.stdout.flush()
    if spinner is not None:
        spinner.terminate()


def _engine_run(gap: int, n: int) -> tuple[list[float], list[float]]:
    """(training-step seconds, per-query seconds) of one training with queries after each of
    the last ``n`` steps."""
    import torch
    from torch import nn

    engine, model, opt, loader = _private_mlp(64, 128, 10, MOMENTUM)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=gap + n)
    loss_fn = nn.CrossEntropyLoss()
    steps, queries, done = [], [], 0
    while done < gap + n:
        for x, y in loader:
            if done == gap + n:
                break
            t0 = time.perf_counter()
            opt.zero_grad()
            if len(x):
                loss_fn(model(x), y).backward()
            opt.step()
            sched.step()
            steps.append(time.perf_counter() - t0)
            done += 1
            if done > gap:
                t0 = time.perf_counter()
                engine.get_epsilon(DELTA)
                queries.append(time.perf_counter() - t0)
    return steps, queries


def engine_table(gap: int, n: int, repeats: int) -> None:
    """``engine.get_epsilon`` at every step after ``gap`` unqueried steps of a real Opacus
    training (a small MLP, momentum 0.9 + cosine), against the training step itself: each
    ratio against the median step of its own run; median [range] over ``repeats`` runs (one
    first query per run: a single time slice of a shared machine moves it)."""
    warnings.simplefilter("ignore")
    runs = [_engine_run(gap, n) for _ in range(repeats)]
    step = [statistics.median(s) for s, _ in runs]
    med = [statistics.median(q) / st for (_, q), st in zip(runs, step)]
    first = [q[0] / st for (_, q), st in zip(runs, step)]
    top = [max(q) / st for (_, q), st in zip(runs, step)]

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"

    print(f"\nengine.get_epsilon after each step, after {gap} unqueried steps (small MLP "
          f"64-128-10, batch 64, momentum {MOMENTUM} + cosine, {n} queries, {repeats} runs): "
          f"training step median {_ms(statistics.median(step)).strip()} ms; per query, against "
          f"its run's step: median {cell(med)}, first {cell(first)}, max {cell(top)}")  # fmt: skip
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI: T = 1e3, 1e4; fewer steps")
    parser.add_argument("--steps", type=int, nargs="+", default=None)
    parser.add_argument("--no-monitor", action="store_true")
    parser.add_argument("--no-queries", action="store_true", help="the monitor's overhead only")
    parser.add_argument("--batch-only", action="store_true",
                        help="only the batched heuristic table")
    parser.add_argument("--monitor-steps", type=int, default=None,
                        help="steps of each monitored run (default 300, 100 quick)")
    parser.add_argument("--step-ms", type=float, nargs="+", default=[2.0, 20.0],
                        help="padded step lengths of the overhead table (ms)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each query pattern; each query's time is the least")
    parser.add_argument("--monitor-repeats", type=int, default=None,
                        help="repeats of each monitored run (default 3, 1 quick)")
    parser.add_argument("--busy", action="store_true",
                        help="another process spins on a core during the overhead table")
    args = parser.parse_args()
    steps = args.steps or ([1_000, 10_000] if args.quick else [1_000, 10_000, 100_000])
    n = 10 if args.quick else 30
    if args.batch_only:
        batch_table(steps, 200 if args.quick else 640)
        return 0
    if not args.no_queries:
        query_table(steps, n, repeats=args.repeats)
        batch_table(steps, 200 if args.quick else 640)
    if not args.no_queries:
        engine_table(GAP, n, 2 if args.quick else 5)
    if not args.no_monitor:
        steps_m = args.monitor_steps or (100 if args.quick else 300)
        repeats = args.monitor_repeats or (1 if args.quick else 3)
        overhead_table(steps_m, repeats, tuple(args.step_ms), busy=args.busy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
