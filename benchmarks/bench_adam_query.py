"""The adaptive heuristic of an AdamW run (linear warm-up then linear decay) queried after
every step, as the monitor's replica asks it: median and largest seconds of a step's
``replay_step`` + ``get_epsilon`` over the ``--queries`` steps after T, at sigma 1, q 0.01,
delta 1e-5, accuracy 1e-3, noise std sigma C / B with C = 1, B = 256.

Routes: ``kept`` (AdamW without L2 weight decay: the SGD-equivalent run followed by the kept
weighted engine, :class:`opacus_lastiterate.analysis.last_iterate.adaptive_steps.SGDEquivalent`)
and ``scratch`` (Adam with L2 weight decay, which has no SGD equivalent: the weighted
heuristic of the adaptive weights from scratch at each query; ``--scratch`` to run it, slow).

    python benchmarks/bench_adam_query.py                  # T = 10^4, 200 queries
    python benchmarks/bench_adam_query.py --steps 1000 --scratch
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings

DELTA, SIGMA, Q, STD = 1e-5, 1.0, 0.01, 1.0 / 256


def _step(name: str, t: int, total: int, warm: int, decoupled: bool) -> AdaptiveStep:
    lr = 1e-3 * max(1e-3, min((t + 1) / warm, (total - t) / (total - warm)))
    settings = AdaptiveSettings(name, lr, weight_decay=0.01 if decoupled else 1e-4)
    return AdaptiveStep(settings, STD)


def run(route: str, steps: int, queries: int) -> tuple[float, float, float, float]:
    name = "adamw" if route == "kept" else "adam"
    total, warm = steps + queries, max(1, steps // 20)
    acc = LastIterateAccountant()
    for t in range(steps):
        acc.replay_step(SIGMA, Q, _step(name, t, total, warm, route == "kept"))
    t0 = time.perf_counter()
    acc.get_epsilon(DELTA)
    first = time.perf_counter() - t0
    times = []
    for t in range(steps, total):
        t0 = time.perf_counter()
        acc.replay_step(SIGMA, Q, _step(name, t, total, warm, route == "kept"))
        eps = acc.get_epsilon(DELTA)
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), max(times), eps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--scratch", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for route in ("kept", "scratch") if args.scratch else ("kept",):
        first, median, largest, eps = run(route, args.steps, args.queries)
        print(f"{route:8s} T={args.steps}: first query {first * 1e3:.2f} ms, per step "
              f"median {median * 1e3:.3f} ms, largest {largest * 1e3:.2f} ms "
              f"({args.queries} steps), eps {eps:.4f}")


if __name__ == "__main__":
    main()
