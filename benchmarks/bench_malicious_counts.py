"""Benchmark: the malicious data set's scores, analytic path (trials x T) vs counts path.

T = 100, q = 0.01, sigma = 0.6 (the reproduction's setting); both sides timed, twice each,
and the ratio printed. The counts path draws the score's sufficient statistic (decoded
record count, last coordinate) directly, so its time does not grow with T.

    python benchmarks/bench_malicious_counts.py [--trials N] [--steps T]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opacus_lastiterate.auditing import (
    DPSGDArithmetic,
    MaliciousDataset,
    PoissonInsertion,
    simulate_malicious_dataset,
)


def both_sides(attack, arith, trials: int, method: str, seed: int) -> float:
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for inside in (True, False):
        simulate_malicious_dataset(attack, arith, trials=trials, rng=rng, canary_in=inside, method=method)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1_000_000, help="trials per side")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    attack = MaliciousDataset(steps=args.steps, insertion=PoissonInsertion(0.01), last_threshold=3.0)
    arith = DPSGDArithmetic(0.6)
    print(f"{args.trials} trials per side, T = {args.steps} (both sides timed)")
    best = {}
    for method in ("analytic", "counts"):
        times = [both_sides(attack, arith, args.trials, method, seed) for seed in range(2)]
        best[method] = min(times)
        print(f"{method:<9} " + "  ".join(f"run {i + 1}: {t:7.3f} s" for i, t in enumerate(times)))
    print(f"counts path {best['analytic'] / best['counts']:.1f}x faster than the analytic path")


if __name__ == "__main__":
    main()
