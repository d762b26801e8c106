"""Benchmark: 100,000 trials x T = 1000 steps of the adversarial-data-set simulation.

Target (issue 4): <= 10 s on 2 cores. Times both sides (canary in / out) of the analytic
path (Binomial count + one Gaussian per trial) and, for reference, of the literal
step-by-step path (vectorised over trials, a loop over the T steps), plus the realised
batch-size (ASGM) analytic path with 100 zero-gradient records. Each is measured twice.

    python benchmarks/bench_audit_simulator.py [--trials N] [--steps T] [--skip-literal]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from opacus_lastiterate.auditing import (
    AdversarialDataset,
    DPSGDArithmetic,
    PoissonInsertion,
    audit_scores,
    simulate_adversarial_dataset,
)


def both_sides(attack, arith, steps, trials, method, seed) -> tuple[float, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    ins = simulate_adversarial_dataset(attack, arith, steps=steps, trials=trials, rng=rng, canary_in=True, method=method)
    outs = simulate_adversarial_dataset(attack, arith, steps=steps, trials=trials, rng=rng, canary_in=False, method=method)
    return time.perf_counter() - start, ins, outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000, help="trials per side")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--skip-literal", action="store_true")
    args = parser.parse_args()
    q, sigma = 0.01, 1.0
    cases = [
        ("SGM analytic", AdversarialDataset(PoissonInsertion(q)), DPSGDArithmetic(sigma), "analytic"),
        ("ASGM analytic (100 others)", AdversarialDataset(PoissonInsertion(q), num_others=100),
         DPSGDArithmetic(sigma, normalisation="realised"), "analytic"),
    ]
    if not args.skip_literal:
        cases.append(("SGM literal", AdversarialDataset(PoissonInsertion(q)), DPSGDArithmetic(sigma), "literal"))
    print(f"{args.trials} trials per side x T = {args.steps}, q = {q}, sigma = {sigma} (both sides timed)")
    for name, attack, arith, method in cases:
        for rep in range(2):
            secs, ins, outs = both_sides(attack, arith, args.steps, args.trials, method, seed=rep)
            rate = 2 * args.trials / secs
            print(f"{name:<28} run {rep + 1}: {secs:7.3f} s  {rate:,.0f} trials/s  "
                  f"({2 * args.trials * args.steps / secs:,.0f} trial-steps/s)")
    start = time.perf_counter()
    audit = audit_scores(ins, outs, delta=1e-5)
    print(f"audit of the last pair (bound + estimate): {time.perf_counter() - start:.3f} s; "
          f"bound {audit.bound.epsilon:.3f}, GDP estimate {audit.estimate.epsilon:.3f}")


if __name__ == "__main__":
    main()
