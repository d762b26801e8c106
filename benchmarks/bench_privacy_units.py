"""Record-level, user-level and group privacy for one fine-tuning set-up (docs/privacy_units.md).

N = 50,000 records, expected batch 256 (q = 256 / 50,000), sigma = 1.0, 3 epochs, plain SGD with
a cosine learning-rate schedule (no momentum), delta = 1e-6. Prints the markdown tables of
docs/privacy_units.md with the time of each number.

    python benchmarks/bench_privacy_units.py
"""

from __future__ import annotations

import math
import time

import numpy as np

from opacus_lastiterate.analysis.baselines.composition import (
    RDPComposition,
    StandardComposition,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import BallsInBins, ShuffledBatches
from opacus_lastiterate.analysis.user_level import (
    UserLevelHeuristic,
    UserLevelSamplingHeuristic,
)
from opacus_lastiterate.analysis.user_level_standard import (
    GroupPrivacyConversion,
    UserLevelComposition,
    UserLevelNoAmplificationBound,
)

N, BATCH, SIGMA, EPOCHS, DELTA = 50_000, 256, 1.0, 3, 1e-6
Q = BATCH / N
ACCURACY = 1e-2  # heuristic: rounded up, within 1% above the exact value of its pair
INTERVAL = 1e-3  # PLD value discretisation (pessimistic)
UNITS = (1, 4, 16, 64)


def timed(f):
    start = time.perf_counter()
    value = f()
    return value, time.perf_counter() - start


def cosine_weights(steps: int) -> np.ndarray:
    lrs = 0.5 * (1.0 + np.cos(np.pi * np.arange(steps) / steps))
    return sgd_weights(lrs)


def fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}" if value >= 100 else f"{value:.3f}"


def poisson_table() -> None:
    steps = round(EPOCHS / Q)
    weights = cosine_weights(steps)
    record = DPSGDRun.from_history([(SIGMA, Q, steps)], weights=weights)
    standard = StandardComposition(record, value_discretization_interval=INTERVAL)
    rdp = RDPComposition(record)
    print(f"Poisson, T = {steps}, cosine schedule, delta = {DELTA:g}")
    print("| unit | heuristic | standard (MoG PLD) | group conversion of the record-level standard | seconds (heur., std.) |")
    print("|---|---|---|---|---|")
    for k in UNITS:
        unit = PrivacyUnit.record() if k == 1 else PrivacyUnit.user(max_records=k)
        run = DPSGDRun.from_history([(SIGMA, Q, steps)], weights=weights, unit=unit)
        heur, t_h = timed(lambda run=run: UserLevelHeuristic(run, accuracy=ACCURACY).epsilon(DELTA))
        std, t_s = timed(
            lambda run=run: UserLevelComposition(
                run, value_discretization_interval=INTERVAL
            ).epsilon(DELTA)
        )
        group = min(
            GroupPrivacyConversion(standard, k).epsilon(DELTA),
            GroupPrivacyConversion(rdp, k).epsilon(DELTA),
        )
        name = "record" if k == 1 else f"user, k = {k} (= group of {k})"
        print(f"| {name} | {fmt(heur)} | {fmt(std)} | {fmt(group)} | {t_h:.1f}, {t_s:.1f} |")


def epoch_table() -> None:
    per_epoch = -(-N // BATCH)
    steps = EPOCHS * per_epoch
    print(f"\nEpoch schemes, T = {steps} ({per_epoch} steps per epoch), delta = {DELTA:g}")
    print("| unit | shuffled heuristic, constant lr | shuffled heuristic, cosine | balls-in-bins heuristic, constant lr | standard (no amplification, k-fold) | seconds (shuffled cosine) |")
    print("|---|---|---|---|---|---|")
    shuffled, balls = ShuffledBatches(N, BATCH), BallsInBins(per_epoch)
    weights = cosine_weights(steps)
    for k in UNITS:
        unit = PrivacyUnit.record() if k == 1 else PrivacyUnit.user(max_records=k)
        flat = DPSGDRun.from_history([(SIGMA, 1 / per_epoch, steps)], sampling=shuffled, unit=unit)
        cosine = DPSGDRun.from_history(
            [(SIGMA, 1 / per_epoch, steps)], weights=weights, sampling=shuffled, unit=unit
        )
        bins = DPSGDRun.from_history([(SIGMA, 1 / per_epoch, steps)], sampling=balls, unit=unit)
        s_flat = UserLevelSamplingHeuristic(flat).epsilon(DELTA)
        if k <= 16:
            s_cos, t_cos = timed(
                lambda r=cosine: UserLevelSamplingHeuristic(r, accuracy=ACCURACY).epsilon(DELTA)
            )
            cos_text, t_text = fmt(s_cos), f"{t_cos:.1f}"
        else:
            cos_text, t_text = "(not run)", "-"
        b_flat = UserLevelSamplingHeuristic(bins).epsilon(DELTA)
        std = UserLevelNoAmplificationBound(flat).epsilon(DELTA)
        name = "record" if k == 1 else f"user, k = {k}"
        print(f"| {name} | {fmt(s_flat)} | {cos_text} | {fmt(b_flat)} | {fmt(std)} | {t_text} |")


if __name__ == "__main__":
    poisson_table()
    epoch_table()
