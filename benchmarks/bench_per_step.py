"""Per-step accounting: epsilon asked for after every training step.

Times ``LastIterateAccountant.get_epsilon`` called after every ``step`` (the incremental
path), against the from-scratch computation of the same number at sampled steps (what every
call cost before incremental accounting), and Opacus's RDP and PRV accountants, each asked
at the same sampled steps. Prints amortised (mean), median and worst single-call times and
the ratios; checks that the incremental values equal the from-scratch ones.

    python benchmarks/bench_per_step.py                   # T = 10^5, q = 0.01, sigma = 1
    python benchmarks/bench_per_step.py --steps 1000000   # about 2 minutes
    python benchmarks/bench_per_step.py --schedule        # SGD momentum 0.9 + cosine lr
    python benchmarks/bench_per_step.py --steps 2000 --rate-growth 1 --no-prv
        # a sample rate that changes at every step: q_t = q (1 + t / T)
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np


def _sampled_steps(total: int, count: int) -> list[int]:
    return sorted({int(t) for t in np.geomspace(1, total, count)})


def _time(fn, *args) -> tuple[float, float]:
    t0 = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - t0, value


def _cpu_time(fn, *args) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this thread, value): on a shared machine the wall time
    of one call includes time spent waiting for a core; the CPU time does not."""
    w0, c0 = time.perf_counter(), time.thread_time()
    value = fn(*args)
    return time.perf_counter() - w0, time.thread_time() - c0, value


def _summary(name: str, seconds: list[float]) -> str:
    ms = np.asarray(seconds) * 1e3
    return (
        f"{name:<34} mean {ms.mean():9.4f} ms   median {np.median(ms):9.4f} ms   "
        f"max {ms.max():9.3f} ms   ({len(ms)} calls)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--sample-rate", type=float, default=0.01)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--samples", type=int, default=12, help="sampled steps for references")
    parser.add_argument(
        "--schedule", action="store_true", help="SGD momentum 0.9 + cosine learning rate"
    )
    parser.add_argument("--no-prv", action="store_true", help="skip Opacus PRV (slow)")
    parser.add_argument("--rate-growth", type=float, default=0.0, metavar="G",
                        help="a new sample rate at every step: q_t = q (1 + G t / T)")
    args = parser.parse_args()

    from opacus.accountants import PRVAccountant, RDPAccountant

    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic

    warnings.simplefilter("ignore")
    total, q, sigma, delta = args.steps, args.sample_rate, args.noise_multiplier, args.delta
    sampled = set(_sampled_steps(total, args.samples))
    print(
        f"T = {total}, q = {q}, sigma = {sigma}, delta = {delta}"
        + (", SGD momentum 0.9 + cosine lr" if args.schedule else ", plain SGD")
        + (f", q_t = q (1 + {args.rate_growth:g} t / T)" if args.rate_growth else "")
    )

    acc = LastIterateAccountant()
    optimizer = None
    if args.schedule:
        import torch

        param = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
        optimizer.noise_multiplier = sigma  # what the hook reads from a DPOptimizer
        optimizer.accumulated_iterations = 1
        hook = acc.get_optimizer_hook_fn(q)

    per_step: list[float] = []
    per_step_cpu: list[float] = []
    scratch: list[float] = []
    worst = 0.0
    histories: dict[int, list] = {}
    for t in range(1, total + 1):
        if optimizer is not None:
            hook(optimizer)
            scheduler.step()
        else:
            acc.step(noise_multiplier=sigma, sample_rate=q * (1 + args.rate_growth * t / total))
        dt, cpu, eps = _cpu_time(acc.get_epsilon, delta)
        per_step.append(dt)
        per_step_cpu.append(cpu)
        if t in sampled:  # the same number computed from scratch
            run = acc._weighted_run() if acc._weights_in_use() else acc.run
            model = LastIterateHeuristic(run, accuracy=acc.weight_accuracy)
            dt, ref = _time(model.epsilon, delta)
            scratch.append(dt)
            worst = max(worst, abs(eps - ref) / max(ref, 1e-300))
            histories[t] = acc.history
    print(_summary("incremental (every step), wall", per_step))
    print(_summary("incremental (every step), CPU", per_step_cpu))
    print(_summary("from scratch (sampled steps)", scratch))
    print(f"  largest relative difference incremental vs from scratch: {worst:.2e}")

    refs = [("Opacus RDP (sampled steps)", RDPAccountant)]
    if not args.no_prv:
        refs.append(("Opacus PRV (sampled steps)", PRVAccountant))
    mean_ours = float(np.mean(per_step))
    for name, cls in refs:
        times = []
        for t in sorted(sampled):
            ref = cls()
            ref.history = histories[t]
            try:
                dt, _ = _time(ref.get_epsilon, delta)
            except Exception as err:  # PRV fails for some long runs
                print(f"{name}: failed at T = {t}: {type(err).__name__}")
                break
            times.append(dt)
        if times:
            print(_summary(name, times) + f"   ratio to ours (mean): {np.mean(times) / mean_ours:8.1f}x")
    if scratch:
        print(f"from-scratch / incremental (mean): {np.mean(scratch) / mean_ours:.1f}x")
    if not math.isfinite(mean_ours):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
