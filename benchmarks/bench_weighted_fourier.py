"""The weighted heuristic by characteristic-function inversion against the weight grid, its
fallback where it declines (``docs/last_iterate.md``, "Weighted heuristic without a grid").

On SGD momentum 0.9 with a cosine schedule, sigma = 1, q = 0.045 (the examples' digits
setting), delta = 1e-5, accuracy 1e-3; CPU time of this process:

* from scratch: a new ``IncrementalCharacteristic`` asked once, against
  ``weighted_heuristic_epsilon_result`` (the grid);
* per step: an ``IncrementalWeightedHeuristic`` fed step by step and asked every 100 steps
  (the monitor's default cadence; the characteristic function kept step by step), against
  the grid from scratch at the last step.

Each line prints both epsilons and brackets, the time ratio grid / Fourier, and whether the
two brackets overlap (they must: both contain the exact value).

    python benchmarks/bench_weighted_fourier.py
    python benchmarks/bench_weighted_fourier.py --steps 500 2000 5000
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np

from opacus_lastiterate.analysis.last_iterate.incremental_fourier import IncrementalCharacteristic
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import cosine_schedule, sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_epsilon_result,
)

Q, SIGMA, DELTA, ACC = 64 / 1437, 1.0, 1e-5, 1e-3


def _timed(fn):
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def _incremental(lrs: np.ndarray):
    eng = IncrementalWeightedHeuristic(ACC)
    result = None
    for t, lr in enumerate(lrs, 1):
        eng.append(SIGMA, Q, float(lr), momentum=0.9)
        if t % 100 == 0 or t == lrs.size:
            result = eng.epsilon(DELTA)
    return result


def _fresh(lrs: np.ndarray):
    got = IncrementalCharacteristic(0.9, 0.0, False).solve(
        DELTA, lrs.tolist(), [SIGMA] * lrs.size, [Q] * lrs.size, ACC
    )
    return None if got is None else SimpleNamespace(epsilon=got[0], lower_bound=got[1])


def _line(label: str, grid, t_grid: float, fourier, t_fourier: float) -> str:
    if fourier is None:
        return f"  {label}: grid {grid.epsilon:.6f} in {t_grid:.3f} s; Fourier route declined"
    overlap = fourier.lower_bound <= grid.epsilon and grid.lower_bound <= fourier.epsilon
    return (
        f"  {label}: grid [{grid.lower_bound:.6f}, {grid.epsilon:.6f}] {t_grid:.3f} s; "
        f"Fourier [{fourier.lower_bound:.9f}, {fourier.epsilon:.9f}] {t_fourier:.4f} s; "
        f"ratio {t_grid / t_fourier:.0f}x; brackets overlap: {overlap}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[500, 2000])
    args = parser.parse_args()
    print(f"momentum 0.9, cosine, sigma {SIGMA}, q {Q:.4f}, delta {DELTA}, accuracy {ACC}")
    for steps in args.steps:
        lrs = cosine_schedule(0.5, steps)
        w = sgd_weights(lrs, momentum=0.9)
        qq, ss = np.full(steps, Q), np.full(steps, SIGMA)
        print(f"T = {steps}")
        grid, t_grid = _timed(lambda: weighted_heuristic_epsilon_result(
            DELTA, weights=w, sample_rates=qq, noise_multipliers=ss, accuracy=ACC))  # fmt: skip
        four, t_four = _timed(lambda: _fresh(lrs))
        print(_line("from scratch", grid, t_grid, four, t_four))
        four, t_four = _timed(lambda: _incremental(lrs))
        print(_line("per step, asked every 100 steps (grid: once)", grid, t_grid, four, t_four))
    return 0


if __name__ == "__main__":
    sys.exit(main())
