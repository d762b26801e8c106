"""Command-line interface: ``opacus-lastiterate`` (or ``python -m opacus_lastiterate``).

Subcommands:
    epsilon   heuristic, robust heuristic, standard and full-batch epsilon of a configuration
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="opacus-lastiterate",
        description="Final-model (last-iterate) privacy accounting for DP-SGD.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    eps = sub.add_parser(
        "epsilon",
        help="epsilon of T steps of DP-SGD: heuristic, robust heuristic, standard, full batch",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    eps.add_argument("--steps", type=_positive_int, required=True, help="number of steps T")
    eps.add_argument("--sample-rate", type=float, required=True, help="Poisson sampling rate q in (0, 1]")
    eps.add_argument("--noise-multiplier", type=float, required=True, help="noise multiplier sigma > 0")
    eps.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    eps.add_argument(
        "--discretization",
        type=float,
        default=1e-4,
        help="value discretisation interval of the PLD accountant for the standard epsilon",
    )
    eps.add_argument("--json", action="store_true", help="print one JSON object")
    eps.set_defaults(handler=_run_epsilon)
    return parser


def _run_epsilon(args: argparse.Namespace) -> int:
    from opacus_lastiterate.analysis.comparison import EpsilonComparison, compare_epsilons

    result = compare_epsilons(
        args.delta,
        steps=args.steps,
        sample_rate=args.sample_rate,
        noise_multiplier=args.noise_multiplier,
        value_discretization_interval=args.discretization,
    )
    if args.json:
        payload = {
            "steps": args.steps,
            "sample_rate": args.sample_rate,
            "noise_multiplier": args.noise_multiplier,
            **result.as_dict(),
            "labels": EpsilonComparison.LABELS,
        }
        print(json.dumps(payload))
        return 0
    print(
        f"DP-SGD, T = {args.steps} steps, q = {args.sample_rate:g}, "
        f"sigma = {args.noise_multiplier:g}, delta = {args.delta:g}"
    )
    for key in ("heuristic", "robust_heuristic", "standard", "full_batch"):
        print(f"  {key:<17} eps = {getattr(result, key):10.4f}   {EpsilonComparison.LABELS[key]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, TypeError) as err:
        parser.exit(2, f"opacus-lastiterate {args.command}: error: {err}\n")
    return 0  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
