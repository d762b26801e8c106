"""Speed of the ASGM accountant (T = 10,000 steps) beside Opacus's PRV accountant.

For each configuration: the median wall time and value of ``asgm_epsilon`` ("batch size
revealed" model, both neighbours and directions, pessimistic PLD) and of Opacus's
``PRVAccountant.get_epsilon`` on the same (q, sigma, T), which computes the *SGM* epsilon
(no batch normalisation), and the ratios. Target: ASGM <= 2 s at T = 10,000.

    python benchmarks/bench_asgm.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

from opacus.accountants import PRVAccountant

from opacus_lastiterate.analysis.normalisation import asgm_epsilon
from opacus_lastiterate.analysis.normalisation.asgm import ASGM_MODEL

CONFIGS = [
    dict(
        dataset_size=60_000,
        sample_rate=256 / 60_000,
        noise_multiplier=1.0,
        steps=10_000,
        delta=1e-5,
    ),
    dict(dataset_size=1_000, sample_rate=0.01, noise_multiplier=1.0, steps=10_000, delta=1e-5),
    dict(dataset_size=100, sample_rate=0.05, noise_multiplier=2.0, steps=10_000, delta=1e-5),
]


def median_time(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    times, value = [], float("nan")
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def prv(cfg: dict) -> Callable[[], float]:
    def run() -> float:
        acc = PRVAccountant()
        acc.history = [(cfg["noise_multiplier"], cfg["sample_rate"], cfg["steps"])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(acc.get_epsilon(delta=cfg["delta"]))

    return run


def asgm(cfg: dict) -> Callable[[], float]:
    def run() -> float:
        return asgm_epsilon(
            cfg["delta"],
            dataset_size=cfg["dataset_size"],
            sample_rate=cfg["sample_rate"],
            noise_multiplier=cfg["noise_multiplier"],
            steps=cfg["steps"],
        )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"ASGM model: {ASGM_MODEL}; Opacus PRV: SGM (no normalisation). Median of {args.repeats}."
    )
    header = (
        f"{'N':>7} {'q':>9} {'sigma':>5} {'T':>6} | {'ASGM eps':>9} {'time s':>7} | "
        f"{'PRV eps':>8} {'time s':>7} | {'time ratio':>10} {'eps ratio':>9}"
    )
    print(header)
    print("-" * len(header))
    worst = 0.0
    for cfg in CONFIGS:
        t_ours, e_ours = median_time(asgm(cfg), args.repeats)
        t_prv, e_prv = median_time(prv(cfg), args.repeats)
        worst = max(worst, t_ours)
        print(
            f"{cfg['dataset_size']:>7} {cfg['sample_rate']:>9.5f} {cfg['noise_multiplier']:>5.2f} "
            f"{cfg['steps']:>6} | {e_ours:>9.4f} {t_ours:>7.3f} | {e_prv:>8.4f} {t_prv:>7.3f} | "
            f"{t_ours / t_prv:>10.2f} {e_ours / e_prv:>9.3f}"
        )
    print(f"slowest ASGM call: {worst:.3f} s (target <= 2 s): {'OK' if worst <= 2.0 else 'SLOW'}")


if __name__ == "__main__":
    main()
