"""Batched per-step heuristic: ``IncrementalHeuristic.advance`` against step-by-step calls.

A monitor evaluates the queued steps of a constant-rate run in batches (``flush_every``).
This times, per step, ``append`` + ``epsilon`` called once per step (the path an accountant
asked after every step takes) against ``advance(sigma, q, batch, delta)`` (the pairs of a
batch solved together, :mod:`~opacus_lastiterate.analysis.last_iterate.gaussian_mixture_stack`),
from the same starting T, and prints the ratio and the largest relative difference between
the two paths' epsilons. Beyond ``STACK_MAX_POINTS`` points in the count window ``advance``
goes step by step itself (its rows are marked).

    python benchmarks/bench_batched_heuristic.py
    python benchmarks/bench_batched_heuristic.py --batch 10 --steps 200
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opacus_lastiterate.analysis.last_iterate.canary_count import binomial_count
from opacus_lastiterate.analysis.last_iterate.incremental import (
    STACK_MAX_POINTS,
    IncrementalHeuristic,
)

CASES = [  # (sigma, q, T at the start)
    (1.0, 64 / 1437, 0),  # the examples' digits run from its first step
    (1.0, 64 / 1437, 2_000),
    (0.6, 0.01, 5_000),
    (1.0, 0.001, 100_000),
    (5.0, 0.01, 1_000),
    (1.0, 64 / 1437, 10_000),
    (1.0, 0.01, 1_000_000),
]


def _engine(sigma: float, q: float, start: int) -> IncrementalHeuristic:
    engine = IncrementalHeuristic()
    if start:
        engine.append(sigma, q, start)
    return engine


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps timed per case")
    parser.add_argument("--batch", type=int, default=100, help="steps per advance call")
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    d, n, b = args.delta, args.steps, args.batch
    print(f"{n} steps per case, batches of {b}, delta = {d:g}; microseconds per step")
    print(f"{'sigma':>6} {'q':>8} {'T start':>9} {'window':>7} {'step by step':>13} "
          f"{'advance':>9} {'ratio':>6} {'max rel diff':>13}")  # fmt: skip
    for sigma, q, start in CASES:
        one = _engine(sigma, q, start)
        t0 = time.perf_counter()
        ref = []
        for _ in range(n):
            one.append(sigma, q)
            ref.append(one.epsilon(d))
        slow = (time.perf_counter() - t0) / n
        many = _engine(sigma, q, start)
        t0 = time.perf_counter()
        got = np.concatenate([many.advance(sigma, q, min(b, n - k), d) for k in range(0, n, b)])
        fast = (time.perf_counter() - t0) / n
        rel = float(np.max(np.abs(got - np.asarray(ref)) / np.asarray(ref)))
        window = binomial_count(start + n, q).log_pmf.size
        mark = "" if window < STACK_MAX_POINTS else " (step by step)"
        print(f"{sigma:6g} {q:8.4g} {start:9d} {window:7d} {1e6 * slow:13.1f} "
              f"{1e6 * fast:9.1f} {slow / fast:6.2f} {rel:13.1e}{mark}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
