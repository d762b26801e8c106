"""Choose batch size and noise by the heuristic: equal final-model epsilon, different costs.

For a data set of N records trained for a fixed number of epochs, every batch size B gets the
noise multiplier that brings the last-iterate heuristic to the same target epsilon (the
last-iterate paper's Table 1 analysis, Steinke et al., arXiv 2410.06186). By default the
robust heuristic (its maximum over the last t <= T steps, what we recommend reporting) is
calibrated; ``--accountant heuristic`` calibrates the plain value as the paper does, and the
table then shows where the robust value runs far above the target. The table shows,
per B: steps, sigma, the noise per example sigma / B (what the model sees), the robust
heuristic and the standard epsilon (every iterate released, a proven upper bound) of the same
configuration. Larger batches need a larger sigma but less noise per example; the standard
epsilon tells how far the all-iterates guarantee is from the heuristic target.

    python examples/plan_hyperparameters.py --dataset-size 50000 --epochs 10 --target-epsilon 4
    python examples/plan_hyperparameters.py --quick        # a few seconds (CI)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from opacus_lastiterate.analysis import plan_batch_sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--dataset-size", type=int, default=50_000, help="N records")
    parser.add_argument("--epochs", type=float, default=10.0, help="passes over the data")
    parser.add_argument("--batch-sizes", default="4096,1024,256,64", help="comma-separated B")
    parser.add_argument("--target-epsilon", type=float, default=4.0, help="target epsilon")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta")
    parser.add_argument(
        "--accountant", choices=["robust_heuristic", "heuristic"], default="robust_heuristic",
        help="what is calibrated to the target",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for plan.json and plan.png")
    parser.add_argument("--quick", action="store_true", help="two batch sizes, 2 epochs (CI)")
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    epochs = args.epochs
    if args.quick:
        sizes, epochs = sizes[:2], 2.0

    plans = plan_batch_sizes(
        args.target_epsilon, args.delta, dataset_size=args.dataset_size, batch_sizes=sizes,
        epochs=epochs, accountant=args.accountant,
    )
    print(f"N = {args.dataset_size}, {epochs:g} epochs, {args.accountant} heuristic epsilon = "
          f"{args.target_epsilon:g} at delta = {args.delta:g}")
    print(f"{'B':>6} {'steps':>7} {'sigma':>8} {'sigma/B':>10} {'heuristic':>10} "
          f"{'robust':>8} {'standard':>9}")
    for p in plans:
        print(f"{p.batch_size:>6} {p.steps:>7} {p.noise_multiplier:>8.3f} "
              f"{p.noise_per_example:>10.5f} {p.heuristic:>10.3f} {p.robust_heuristic:>8.3f} "
              f"{p.standard:>9.3f}")
    print("heuristic: final model only, not a proven bound for deep networks; "
          "standard: every iterate released, an upper bound (dp_accounting PLD)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "plan.json").write_text(json.dumps([p.as_dict() for p in plans], indent=1))
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no plot")
            return
        fig, ax = plt.subplots(figsize=(6, 4))
        b = [p.batch_size for p in plans]
        ax.plot(b, [p.heuristic for p in plans], "o-", label="heuristic")
        ax.plot(b, [p.robust_heuristic for p in plans], "s:", label="robust heuristic")
        ax.plot(b, [p.standard for p in plans], "k^-", label="standard (all iterates)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("expected batch size B")
        ax.set_ylabel(f"epsilon at delta = {args.delta:g}")
        ax.set_title(f"Equal heuristic epsilon, N = {args.dataset_size}, {epochs:g} epochs")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "plan.png", dpi=120)
        print(f"saved {args.out / 'plan.png'}")


if __name__ == "__main__":
    main()
