"""Speed of the last-iterate heuristic against the accountants it sits beside.

Prints the median wall time of the registry's heuristic (``privacy_model("heuristic", run)``;
cold: its cache is cleared before
every call) and of Opacus's RDP and PRV ``get_epsilon`` on the same configuration, and the
ratios. With ``--mog`` it also times dp_accounting's mixture-of-Gaussians PLD, the only other
route to the heuristic, on a smaller T (it takes seconds to minutes per call).

    python benchmarks/bench_heuristic.py [--repeats 15] [--mog]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from opacus_lastiterate.analysis.last_iterate.heuristic_pair import segments_pair
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

CONFIGS = [
    dict(steps=100_000, sample_rate=1e-3, noise_multiplier=1.0, delta=1e-5),
    dict(steps=1_000_000, sample_rate=1e-2, noise_multiplier=1.0, delta=1e-5),
]


def median_time(fn: Callable[[], float], repeats: int) -> tuple[float, float]:
    times, value = [], float("nan")
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


_OPACUS_TIMER = """
import json, statistics, sys, time, warnings
warnings.simplefilter("ignore")
from opacus.accountants import {cls}
cfg, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
times = []
for _ in range(repeats):
    acc = {cls}()
    acc.history = [(cfg["noise_multiplier"], cfg["sample_rate"], cfg["steps"])]
    t0 = time.perf_counter()
    eps = float(acc.get_epsilon(delta=cfg["delta"]))
    times.append(time.perf_counter() - t0)
print(json.dumps([statistics.median(times), eps]))
"""


def opacus_epsilon(cls: str, cfg: dict, repeats: int, timeout: float) -> tuple[float, float]:
    """Median time and value of an Opacus accountant, in a subprocess bounded by ``timeout``
    (Opacus's PRV accountant can run for many minutes at large epsilon)."""
    out = subprocess.run(
        [sys.executable, "-c", _OPACUS_TIMER.format(cls=cls), json.dumps(cfg), str(repeats)],
        capture_output=True, text=True, timeout=timeout, check=True,
    )
    t, eps = json.loads(out.stdout.strip().splitlines()[-1])
    return t, eps


def ours(cfg: dict) -> Callable[[], float]:
    def run() -> float:
        segments_pair.cache_clear()  # cold: the pair is built again
        run = DPSGDRun.constant(steps=cfg["steps"], sample_rate=cfg["sample_rate"],
                                noise_multiplier=cfg["noise_multiplier"])
        return privacy_model("heuristic", run).epsilon(cfg["delta"])

    return run


def mog_epsilon(cfg: dict) -> Callable[[], float]:
    import math

    from dp_accounting.pld import privacy_loss_distribution as pld
    from scipy import stats

    def run() -> float:
        T, q = cfg["steps"], cfg["sample_rate"]
        k = list(range(T + 1))
        w = stats.binom.pmf(k, T, q)
        keep = [i for i in k if w[i] > 1e-15]
        dist = pld.from_mixture_gaussian_mechanism(
            cfg["noise_multiplier"] * math.sqrt(T),
            sensitivities=[float(i) for i in keep],
            sampling_probs=[float(w[i]) for i in keep],
            value_discretization_interval=1e-3,
        )
        return float(dist.get_epsilon_for_delta(cfg["delta"]))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mog", action="store_true", help="also time dp_accounting's MoG PLD route")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per Opacus accountant")
    args = parser.parse_args()
    for cfg in CONFIGS:
        label = f"T={cfg['steps']:.0e}, q={cfg['sample_rate']:g}, sigma={cfg['noise_multiplier']:g}, delta={cfg['delta']:g}"
        print(label)
        t_ours, e_ours = median_time(ours(cfg), args.repeats)
        print(f"  heuristic (ours)          {t_ours * 1e3:9.3f} ms   eps = {e_ours:.6f}")
        for name, cls in (("Opacus RDP", "RDPAccountant"), ("Opacus PRV", "PRVAccountant")):
            try:
                t, e = opacus_epsilon(cls, cfg, max(3, args.repeats // 3), args.timeout)
                print(f"  {name + ' get_epsilon':<25} {t * 1e3:9.3f} ms   eps = {e:.6f}   ratio {t / t_ours:8.1f}x")
            except subprocess.TimeoutExpired:
                print(f"  {name + ' get_epsilon':<25} did not finish in {args.timeout:g} s")
            except subprocess.CalledProcessError as err:  # report, do not hide, a failure
                print(f"  {name + ' get_epsilon':<25} failed: {err.stderr.strip().splitlines()[-1]}")
    if args.mog:
        cfg = dict(steps=1000, sample_rate=1e-2, noise_multiplier=1.0, delta=1e-5)
        print("T=1000, q=0.01, sigma=1, delta=1e-5 (dp_accounting MoG PLD, interval 1e-3)")
        t_ours, e_ours = median_time(ours(cfg), args.repeats)
        t, e = median_time(mog_epsilon(cfg), 1)
        print(f"  heuristic (ours)          {t_ours * 1e3:9.3f} ms   eps = {e_ours:.6f}")
        print(f"  dp_accounting MoG PLD     {t * 1e3:9.3f} ms   eps = {e:.6f}   ratio {t / t_ours:8.1f}x")


if __name__ == "__main__":
    main()
