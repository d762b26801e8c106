"""Coverage study: how often each audit statistic exceeds the true epsilon (nominal 5%).

Pairs with a known truth (``opacus_lastiterate.analysis.audit.coverage``):

* Gaussian pairs N(0, 1) vs N(mu, 1), mu in {0.5, 1, 2, 4} (mu-GDP exactly), simulated;
* randomised response at e0 in {1, 2} (0/1 scores): exact sums over the counts for the
  deterministic statistics at 256 and 1,024 runs per side, simulated at 4,096 and for the
  random-split strategies.

Multi-run statistics on n runs per side at delta = 1e-5 (each at 95% confidence, the
published one at its own 95% per rate), and the one-run bounds on m = 2n canaries included by
fair coins (delta = 1e-6 for the Gaussian pairs, 0 for randomised response). Writes
``OUT/audit_coverage.json`` and prints the table of ``docs/input_audit_protocols.md``.

    OMP_NUM_THREADS=1 python scripts/audit_coverage_study.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.analysis.audit.coverage import (
    COVERAGE_STATISTICS,
    Exceedance,
    audit_statistics,
    exceedance_exact_binary,
    exceedance_simulated,
    rr_true_epsilon,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon

DELTA, ONE_RUN_DELTA, CONFIDENCE = 1e-5, 1e-6, 0.95
RANDOM = ("clopper-pearson, held-out split", "clopper-pearson, multi-split (11)")
ONE_RUN = {"one-run (Steinke et al.)": "bound", "one-run f-DP (epsilon-delta)": "bound"}


def one_run_statistics(delta: float) -> dict[str, Any]:
    def one(coins_scores: tuple[np.ndarray, np.ndarray], fdp: bool) -> float:
        scores, coins = coins_scores
        a = ScoreAudit.from_canaries(scores, coins)
        r = a.one_run_fdp(delta=delta) if fdp else a.one_run(delta=delta)
        return r.epsilon

    return {
        "one-run (Steinke et al.)": lambda cs, _o, _r: one(cs, False),
        "one-run f-DP (epsilon-delta)": lambda cs, _o, _r: one(cs, True),
    }


def gaussian_sampler(mu: float, n: int):
    return lambda rng: (rng.normal(mu, 1.0, n), rng.normal(0.0, 1.0, n))


def rr_sampler(e0: float, n: int):
    p = math.exp(e0) / (1 + math.exp(e0))
    return lambda rng: ((rng.random(n) < p).astype(float), (rng.random(n) < 1 - p).astype(float))


def canary_sampler(pair, m: int):
    """m canaries, fair coins; included ones scored from the pair's in-side, others out-side."""
    def sample(rng):
        coins = rng.random(m) < 0.5
        ins, outs = pair(rng)  # each of size >= m
        scores = np.where(coins, ins[:m], outs[:m])
        return (scores, coins), None
    return sample


def run_setting(pair_name: str, param: float, n: int, reps: int, seed: int,
                exact: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    stats = audit_statistics(DELTA, CONFIDENCE)
    if pair_name == "gaussian":
        truth, truth_1run = gaussian_epsilon(mu=param, delta=DELTA), gaussian_epsilon(mu=param, delta=ONE_RUN_DELTA)
        sampler, one_delta = gaussian_sampler(param, n), ONE_RUN_DELTA
        big = gaussian_sampler(param, 2 * n)
    else:
        truth, truth_1run = rr_true_epsilon(param, DELTA), param
        sampler, one_delta = rr_sampler(param, n), 0.0
        big = rr_sampler(param, 2 * n)
    results: dict[str, Exceedance] = {}
    if exact:
        p = math.exp(param) / (1 + math.exp(param))
        det = {k: v for k, v in stats.items() if k not in RANDOM}
        results.update(exceedance_exact_binary(det, n, n, p, 1 - p, truth))
        rand = {k: v for k, v in stats.items() if k in RANDOM}
        results.update(exceedance_simulated(rand, sampler, truth, reps=reps, seed=seed))
    else:
        results.update(exceedance_simulated(stats, sampler, truth, reps=reps, seed=seed))
    one_reps = max(reps // 2, 1)
    results.update(exceedance_simulated(
        one_run_statistics(one_delta), canary_sampler(big, 2 * n), truth_1run,
        reps=one_reps, seed=seed + 1))
    return {
        "pair": pair_name, "parameter": param, "runs_per_side": n,
        "true_epsilon": truth, "one_run": {"canaries": 2 * n, "delta": one_delta,
                                           "true_epsilon": truth_1run},
        "delta": DELTA, "confidence": CONFIDENCE,
        "labels": {**COVERAGE_STATISTICS, **ONE_RUN},
        "exceedance": {k: v.as_dict() for k, v in results.items()},
        "seconds": time.perf_counter() - t0,
    }


def table(cells: list[dict[str, Any]]) -> str:
    names = list(COVERAGE_STATISTICS) + list(ONE_RUN)
    head = "| pair | n per side | true eps | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (3 + len(names))]
    for c in cells:
        pair = (f"Gaussian mu={c['parameter']:g}" if c["pair"] == "gaussian"
                else f"RR e0={c['parameter']:g}")
        row = [pair, str(c["runs_per_side"]), f"{c['true_epsilon']:.2f}"]
        for k in names:
            e = c["exceedance"][k]
            mark = "" if e["method"] == "simulated" else "*"
            cell = f"{100 * e['rate']:.1f}{mark}"
            if e["method"] == "simulated":
                cell += f" ± {100 * e['error']:.1f}"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="CI: one small setting of each pair")
    p.add_argument("--out", type=Path, default=None, help="folder of audit_coverage.json")
    p.add_argument("--reps", type=int, default=2000, help="repetitions (n <= 1024)")
    p.add_argument("--reps-large", type=int, default=1000, help="repetitions at n = 4096")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        plan = [("gaussian", 2.0, 64, 40, False), ("rr", 2.0, 32, 40, True)]
    else:
        plan = []
        for mu in (0.5, 1.0, 2.0, 4.0):
            for n in (256, 1024, 4096):
                plan.append(("gaussian", mu, n, args.reps if n <= 1024 else args.reps_large, False))
        for e0 in (1.0, 2.0):
            for n in (256, 1024):
                plan.append(("rr", e0, n, args.reps, True))
            plan.append(("rr", e0, 4096, args.reps_large, False))
    cells = []
    for i, (pair, param, n, reps, exact) in enumerate(plan):
        cell = run_setting(pair, param, n, reps, args.seed + 1000 * i, exact)
        cells.append(cell)
        print(f"{pair} {param:g} n={n}: {cell['seconds']:.0f} s", flush=True)
    out = {
        "command": " ".join(["python", "scripts/audit_coverage_study.py", *(argv if argv is not None else sys.argv[1:])]),
        "nominal": 1 - CONFIDENCE,
        "cells": cells,
    }
    print(table(cells))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "audit_coverage.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
