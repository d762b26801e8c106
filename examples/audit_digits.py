"""Audit DP-SGD on scikit-learn's digits from the final model only, with R training runs.

Each run trains a small model with Opacus (``PrivacyEngine(accountant="last_iterate")``,
Poisson sampling) on D or on D' = D + canary by a seeded fair coin, keeps only the final
model and scores it. The scores become a statistically valid epsilon LOWER bound
(Clopper-Pearson, Bonferroni over a rank grid), printed beside:

* a Gaussian-DP ESTIMATE from the same scores (assumes a Gaussian trade-off; not a bound);
* the last-iterate HEURISTIC epsilon (final model only; not a DP guarantee);
* the standard composition epsilon (every iterate released): an UPPER bound.

The default gradient canary writes to the weight of a pixel that is zero on every training
image, so the data never move it and the audit targets the heuristic exactly; with R runs it
can certify at most about ln(R / 2 / ln(40)). ``--out DIR`` keeps every run's seed, coin and
score in ``DIR/runs.jsonl``: rerunning the same command resumes an interrupted audit, and
``opacus_lastiterate.auditing.runner.audit_records`` re-audits the file with another
threshold strategy or confidence. ``--quick`` (CI) finishes in well under a minute.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from opacus_lastiterate.analysis.audit import audit_gaussian_dp
from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer
from opacus_lastiterate.auditing.runner import AuditRunner, audit_records

BOUND_LABEL = "LOWER bound (Clopper-Pearson, statistically valid)"
ESTIMATE_LABEL = "estimate (assumes a Gaussian trade-off; not a bound)"
HEURISTIC_LABEL = "heuristic (last iterate; not a DP guarantee)"
STANDARD_LABEL = "UPPER bound (standard accounting, all iterates)"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=500, help="R, models trained")
    parser.add_argument("--steps", type=int, default=50, help="T, DP-SGD steps per model")
    parser.add_argument("--sigma", type=float, default=0.5, help="noise multiplier")
    parser.add_argument("--batch-size", type=int, default=64, help="expected batch size")
    parser.add_argument("--num-examples", type=int, default=400, help="size of D")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C")
    parser.add_argument("--hidden", type=int, default=0, help="hidden units (0: linear)")
    parser.add_argument(
        "--canary", choices=["gradient", "input"], default="gradient", help="canary kind"
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta")
    parser.add_argument("--confidence", type=float, default=0.95, help="audit confidence")
    parser.add_argument("--seed", type=int, default=0, help="master seed of coins and runs")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (0: in-process)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR", help="keep run records in DIR/runs.jsonl"
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--quick", action="store_true", help="64 runs (overrides --runs), for CI")
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 64
    for name in ("runs", "steps", "batch_size", "num_examples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}.")
    if args.runs < 2:
        parser.error(f"--runs must be >= 2, got {args.runs}.")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Train, audit and print the four epsilons; return the exit status."""
    args = parse_args(argv)
    try:
        trainer = OpacusDigitsTrainer(
            canary=args.canary,
            steps=args.steps,
            batch_size=args.batch_size,
            num_examples=args.num_examples,
            noise_multiplier=args.sigma,
            max_grad_norm=args.max_grad_norm,
            learning_rate=args.lr,
            hidden=args.hidden,
        )
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = None if args.out is None else args.out / "runs.jsonl"
    runner = AuditRunner(
        trainer,
        trainer.score,
        num_runs=args.runs,
        seed=args.seed,
        path=path,
        workers=args.workers,
        progress=not args.no_progress,
    )
    print(
        f"Auditing DP-SGD on digits: {args.runs} runs, {args.canary} canary, T = {args.steps}, "
        f"q = {trainer.sample_rate:.4g}, sigma = {args.sigma:g}, C = {args.max_grad_norm:g}, "
        f"delta = {args.delta:g}"
    )
    t0 = time.perf_counter()
    try:
        records = runner.run()
    except (ValueError, RuntimeError) as exc:  # e.g. --out holds another audit's records
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - t0
    resumed = args.runs - runner.last_trained
    print(
        f"trained {runner.last_trained} models in {elapsed:.1f} s"
        + (f" ({resumed} resumed from {path})" if resumed else "")
    )

    bound = audit_records(records, delta=args.delta, confidence=args.confidence)
    estimate = audit_gaussian_dp(
        records.in_scores, records.out_scores, delta=args.delta, confidence=args.confidence
    )
    heuristic = trainer.heuristic_epsilon(args.delta)
    standard = trainer.standard_epsilon(args.delta)
    n_in, n_out = len(records.in_scores), len(records.out_scores)
    print(f"\nruns with the canary: {n_in}, without: {n_out}")
    width = max(len(BOUND_LABEL), len(ESTIMATE_LABEL), len(HEURISTIC_LABEL), len(STANDARD_LABEL))
    rows = [
        (BOUND_LABEL, f">= {bound.epsilon:.3f}"),
        (ESTIMATE_LABEL, f"~  {estimate.epsilon:.3f}"),
        (HEURISTIC_LABEL, f"=  {heuristic:.3f}"),
        (STANDARD_LABEL, f"<= {standard:.3f}"),
    ]
    print(f"{'epsilon at delta = ' + format(args.delta, 'g'):<{width}}  value")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")
    print(f"\naudit: {bound}")
    if path is not None:
        print(f"run records: {path} (rerun to resume; audit_records() to re-audit)")
    if bound.epsilon > standard:
        print("error: the audit's lower bound exceeds the proven upper bound", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
