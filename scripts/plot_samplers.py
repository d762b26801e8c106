"""Plot docs/results/samplers.png: epsilon against steps for Poisson, shuffled and
balls-in-bins batches at one setting (N = 1000, B = 100, sigma = 1, delta = 1e-5). The
balls-in-bins standard number is the random-allocation bound (pld-accounting, the
``allocation`` extra; without it, the no-amplification bound, the shuffled line).

Usage: python scripts/plot_samplers.py [--out docs/results/samplers.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import BallsInBins, ShuffledBatches
from opacus_lastiterate.analysis.sampling_standard import ShuffleLowerBound

N, B, SIGMA, DELTA = 1000, 100, 1.0, 1e-5
STEPS = list(range(10, 201, 10))  # whole epochs of 10 steps
# Okabe-Ito colour-blind-safe palette
COLOURS = {"poisson": "#0072B2", "shuffled": "#D55E00", "balls_in_bins": "#009E73", "lower": "#CC79A7"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="docs/results/samplers.png")
    out = Path(parser.parse_args().out)
    schemes = {"poisson": None, "shuffled": ShuffledBatches(N, B), "balls_in_bins": BallsInBins(N // B)}
    series: dict[str, list[float]] = {}
    for name, scheme in schemes.items():
        runs = [DPSGDRun.from_history([(SIGMA, B / N, t)], sampling=scheme) for t in STEPS]
        series[f"{name} heuristic"] = [privacy_model("heuristic", r).epsilon(DELTA) for r in runs]
        series[f"{name} standard"] = [privacy_model("standard", r).epsilon(DELTA) for r in runs]
        if name == "shuffled":
            series["shuffled lower"] = [ShuffleLowerBound(r).epsilon(DELTA) for r in runs]
    fig, ax = plt.subplots(figsize=(8, 4.8))
    labels = {
        "poisson heuristic": "Poisson: heuristic",
        "poisson standard": "Poisson: standard (PLD upper bound)",
        "shuffled heuristic": "shuffled / balls-in-bins: heuristic (identical here)",
        "shuffled standard": "shuffled: standard (no-amplification upper bound)",
        "balls_in_bins standard": "balls-in-bins: standard (random-allocation upper bound)",
        "shuffled lower": "shuffled: standard lower bound (Chua et al.)",
    }
    styles = {"heuristic": "-", "standard": "--", "lower": ":"}
    for key, label in labels.items():
        scheme, kind = key.split(" ")
        ax.plot(STEPS, series[key], styles[kind], color=COLOURS["lower" if kind == "lower" else scheme],
                marker="o", markersize=3, label=label)
    ax.set_xlabel("steps (10 steps per epoch)")
    ax.set_ylabel(f"epsilon at delta = {DELTA:g}")
    ax.set_title(f"Epsilon by sampling scheme (N = {N}, B = {B}, sigma = {SIGMA:g})")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    for key, values in series.items():
        print(f"{key:24s} T=10: {values[0]:.4f}  T=30: {values[2]:.4f}  T=200: {values[-1]:.4f}")


if __name__ == "__main__":
    main()
