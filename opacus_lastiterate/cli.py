"""Command-line interface: ``opacus-lastiterate`` (or ``python -m opacus_lastiterate``).

Subcommands::

    epsilon         heuristic, robust heuristic, standard and full-batch epsilon (plus the
                    schedule/momentum-weighted heuristic with --lr-schedule / --momentum)
    counterexample  the quadratic-regulariser counterexample beside the heuristic
    normalisation   Opacus 1.x divisor verdict: SGM, FEASGM (corrected, curve) and ASGM epsilons
    compare-versions  one row per Opacus release 0.9.0-1.6.0: what it reports, corrected, warnings
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def _add_dp_sgd_arguments(parser: argparse.ArgumentParser) -> None:
    """--steps, --sample-rate, --noise-multiplier, --delta: one DP-SGD configuration."""
    parser.add_argument("--steps", type=_positive_int, required=True, help="number of steps T")
    parser.add_argument(
        "--sample-rate", type=float, required=True, help="Poisson sampling rate q in (0, 1]"
    )
    parser.add_argument(
        "--noise-multiplier", type=float, required=True, help="noise multiplier sigma > 0"
    )
    parser.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")


def build_parser() -> argparse.ArgumentParser:
    """The ``opacus-lastiterate`` argument parser with every subcommand."""
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
    _add_dp_sgd_arguments(eps)
    eps.add_argument(
        "--discretization",
        type=float,
        default=1e-4,
        help="value discretisation interval of the PLD accountant for the standard epsilon",
    )
    eps.add_argument(
        "--lr-schedule",
        default=None,
        metavar="NAME|FILE",
        help="learning-rate schedule: constant, step (StepLR, --step-size, --gamma), cosine "
        "(CosineAnnealingLR over T), or a text file with one rate per step; with "
        "--momentum it adds the weighted heuristic "
        "(docs/last_iterate.md, 'Per-step weights: schedules and momentum')",
    )
    eps.add_argument("--momentum", type=float, default=0.0, help="heavy-ball momentum (torch SGD)")
    eps.add_argument("--dampening", type=float, default=0.0, help="momentum dampening (torch SGD)")
    eps.add_argument("--nesterov", action="store_true", help="Nesterov momentum (torch SGD)")
    eps.add_argument("--step-size", type=_positive_int, default=None, help="StepLR step size (default T/3)")
    eps.add_argument("--gamma", type=float, default=0.1, help="StepLR decay factor")
    eps.add_argument(
        "--accuracy", type=float, default=1e-3, help="relative accuracy of the weighted heuristic"
    )
    eps.add_argument("--json", action="store_true", help="print one JSON object")
    eps.set_defaults(handler=_run_epsilon)

    cex = sub.add_parser(
        "counterexample",
        help="linear loss + quadratic regulariser against the heuristic "
        "(docs/last_iterate.md, 'Known counterexamples')",
        description=(
            "The final model of DP-SGD on a linear loss with regulariser alpha m^2 / 2 "
            "(eta = 1, d = 1) compared with the heuristic eps_T, one step eps_1 (a zeroing "
            "regulariser) and the robust max_{t<=T} eps_t."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_dp_sgd_arguments(cex)
    cex.add_argument("--alpha", type=float, default=0.5, help="regulariser coefficient in [0, 1]")
    cex.add_argument("--json", action="store_true", help="print one JSON object")
    cex.set_defaults(handler=_run_counterexample)

    norm = sub.add_parser(
        "normalisation",
        help="is Opacus 1.x's printed epsilon valid for this data set size? SGM, FEASGM, ASGM",
        description=(
            "Opacus 1.x make_private(poisson_sampling=True) divides the noisy gradient sum by "
            "int(N / len(DPDataLoader)), a function of the private N "
            "(docs/normalisation.md, 'FEASGM / EASGM with a data-dependent divisor'). "
            "Prints the SGM epsilon Opacus accounts, the FEASGM verdict over N - 1, N, N + 1, "
            "the corrected epsilon and the ASGM (Opacus 0.x, divide by |B|) epsilon."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    norm.add_argument("--dataset-size", type=_positive_int, required=True, help="N = len(dataset)")
    norm.add_argument("--batch-size", type=_positive_int, required=True, help="DataLoader batch size L")
    norm.add_argument("--noise-multiplier", type=float, required=True, help="noise multiplier sigma > 0")
    norm.add_argument("--epochs", type=_positive_int, required=True, help="number of epochs E >= 1")
    norm.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    norm.add_argument(
        "--dimension",
        type=_positive_int,
        default=None,
        help="number of trainable parameters d: adds the dimension-aware FEASGM curve epsilon",
    )
    norm.add_argument("--drop-last", action="store_true", help="the DataLoader has drop_last=True")
    norm.add_argument("--json", action="store_true", help="print one JSON object (inf as \"inf\")")
    norm.set_defaults(handler=_run_normalisation)

    ver = sub.add_parser(
        "compare-versions",
        help="one row per Opacus release (0.9.0-1.6.0): reported vs corrected epsilon, warnings",
        description=(
            "For one training configuration, what each Opacus release runs (mechanism, "
            "divisor), what it reports with its own default accountant, the corrected "
            "epsilon, the last-iterate heuristic and warnings (docs/opacus_versions.md)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ver.add_argument("--dataset-size", type=_positive_int, required=True, help="N = len(dataset)")
    ver.add_argument("--batch-size", type=_positive_int, required=True, help="DataLoader batch size L")
    ver.add_argument("--noise-multiplier", type=float, required=True, help="noise multiplier sigma > 0")
    ver.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    span = ver.add_mutually_exclusive_group()
    span.add_argument("--epochs", type=_positive_int, default=None, help="epochs (default 1)")
    span.add_argument("--steps", type=_positive_int, default=None, help="fixed number of steps")
    ver.add_argument("--dimension", type=_positive_int, default=None,
                     help="trainable parameters d: adds the FEASGM curve epsilon (1.x)")
    ver.add_argument("--loss-reduction", choices=("mean", "sum"), default="mean")
    ver.add_argument("--no-poisson", action="store_true",
                     help="fixed-size shuffled batches (1.x poisson_sampling=False)")
    ver.add_argument("--drop-last", action="store_true", help="the DataLoader has drop_last=True")
    ver.add_argument("--versions", default=None,
                     help="range A..B (inclusive), list A,B or one version; default all 26")
    ver.add_argument("--json", action="store_true", help="print one JSON object (inf as \"inf\")")
    ver.add_argument("--plot", default=None, metavar="FILE", help="save a plot (needs matplotlib)")
    ver.set_defaults(handler=_run_compare_versions)
    return parser


WEIGHTED_LABEL = (
    "last-iterate heuristic with the schedule/momentum weights (final model only; exact for "
    "linear losses up to the stated accuracy, rounded up; not a proven bound for deep networks)"
)


def _learning_rates(args: argparse.Namespace) -> Any:
    """The per-step learning rates of ``--lr-schedule`` (unit base rate: only ratios matter)."""
    import numpy as np

    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
        BUILTIN_SCHEDULES,
        builtin_schedule,
    )

    name = args.lr_schedule or "constant"
    if name in BUILTIN_SCHEDULES:
        options: dict[str, Any] = {}
        if name == "step":
            size = args.step_size if args.step_size is not None else max(1, args.steps // 3)
            options = {"step_size": size, "gamma": args.gamma}
        return builtin_schedule(name, 1.0, args.steps, **options)
    try:
        rates = np.loadtxt(name, dtype=float, ndmin=1)
    except OSError as err:
        raise ValueError(
            f"`--lr-schedule` must be one of {', '.join(BUILTIN_SCHEDULES)} or a readable file "
            f"with one learning rate per step, got {name!r} ({err})."
        ) from None
    if rates.size != args.steps:
        raise ValueError(
            f"`--lr-schedule` file must hold --steps = {args.steps} rates, got {rates.size}."
        )
    return rates


def _run_epsilon(args: argparse.Namespace) -> int:
    from opacus_lastiterate.analysis.comparison import EpsilonComparison, compare_epsilons

    result = compare_epsilons(
        args.delta,
        steps=args.steps,
        sample_rate=args.sample_rate,
        noise_multiplier=args.noise_multiplier,
        value_discretization_interval=args.discretization,
    )
    weighted = None
    if (
        args.lr_schedule is not None
        or args.momentum != 0.0
        or args.dampening != 0.0
        or args.nesterov
    ):
        from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
        from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
            weighted_heuristic_epsilon,
        )

        weights = sgd_weights(
            _learning_rates(args),
            momentum=args.momentum,
            dampening=args.dampening,
            nesterov=args.nesterov,
        )
        weighted = weighted_heuristic_epsilon(
            args.delta,
            weights=weights,
            sample_rates=args.sample_rate,
            noise_multipliers=args.noise_multiplier,
            accuracy=args.accuracy,
        )
    if args.json:
        payload: dict[str, Any] = {
            "steps": args.steps,
            "sample_rate": args.sample_rate,
            "noise_multiplier": args.noise_multiplier,
            **result.as_dict(),
            "labels": dict(EpsilonComparison.LABELS),
        }
        if weighted is not None:
            payload["weighted_heuristic"] = weighted.epsilon
            payload["weighted_relative_accuracy"] = weighted.relative_accuracy
            payload["labels"]["weighted_heuristic"] = WEIGHTED_LABEL
        print(json.dumps(payload))
        return 0
    print(
        f"DP-SGD, T = {args.steps} steps, q = {args.sample_rate:g}, "
        f"sigma = {args.noise_multiplier:g}, delta = {args.delta:g}"
    )
    for key in ("heuristic", "robust_heuristic", "standard", "full_batch"):
        print(f"  {key:<17} eps = {getattr(result, key):10.4f}   {EpsilonComparison.LABELS[key]}")
    if weighted is not None:
        print(
            f"  {'weighted':<17} eps = {weighted.epsilon:10.4f}   {WEIGHTED_LABEL}; schedule "
            f"{args.lr_schedule or 'constant'}, momentum {args.momentum:g}, accuracy "
            f"{weighted.relative_accuracy:.1e}"
        )
    return 0


def _run_counterexample(args: argparse.Namespace) -> int:
    from opacus_lastiterate.analysis.last_iterate.counterexamples import (
        quadratic_regulariser_comparison,
    )

    c = quadratic_regulariser_comparison(
        args.delta,
        steps=args.steps,
        sample_rate=args.sample_rate,
        noise_multiplier=args.noise_multiplier,
        alpha=args.alpha,
    )
    rows = {
        "quadratic": (c.quadratic.epsilon, f"linear loss + {args.alpha:g} m^2 / 2 regulariser "
                      f"({c.quadratic.method}; exact or an upper bound)"),
        "quadratic_lower": (c.quadratic.epsilon_lower, "lower bound of the same"),
        "heuristic": (c.epsilon_linear, "last-iterate heuristic eps_T (alpha = 0)"),
        "one_step": (c.epsilon_one_step, "one step eps_1 (alpha = 1, zeroing regulariser)"),
        "robust_heuristic": (c.epsilon_robust, f"max over t <= T of eps_t (at t = {c.robust_steps})"),
    }
    if args.json:
        payload: dict[str, Any] = {k: v for k, (v, _) in rows.items()}
        payload.update(
            steps=args.steps, sample_rate=args.sample_rate, noise_multiplier=args.noise_multiplier,
            delta=args.delta, alpha=args.alpha, ratio_to_robust=c.ratio_to_robust,
            exceeds_heuristic=c.exceeds_heuristic, labels={k: lab for k, (_, lab) in rows.items()},
        )
        print(json.dumps(payload))
        return 0
    print(
        f"Quadratic-regulariser counterexample, T = {args.steps}, q = {args.sample_rate:g}, "
        f"sigma = {args.noise_multiplier:g}, delta = {args.delta:g}"
    )
    for key, (value, label) in rows.items():
        print(f"  {key:<17} eps = {value:10.4f}   {label}")
    verdict = "exceeds" if c.exceeds_heuristic else "does not exceed"
    print(f"  the quadratic example {verdict} the heuristic; ratio to the robust value "
          f"{c.ratio_to_robust:.4f}")
    return 0


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "nan")


def _fmt_eps(value: float) -> str:
    return f"{value:10.4f}" if math.isfinite(value) else f"{'inf':>10}"


def _normalisation_report(args: argparse.Namespace) -> dict[str, Any]:
    """All numbers of the ``normalisation`` subcommand, each with its model label."""
    from opacus_lastiterate.analysis._validation import (
        check_delta,
        check_int,
        check_noise_multiplier,
    )
    from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
    from opacus_lastiterate.analysis.normalisation import (
        ASGM_MODEL,
        FEASGM_MODEL,
        asgm_epsilon,
        feasgm_epsilon,
        feasgm_verdict,
        opacus1x_batch_arithmetic,
    )

    n = check_int("--dataset-size", args.dataset_size, minimum=2)
    b = check_int("--batch-size", args.batch_size, minimum=1)
    sigma = check_noise_multiplier(args.noise_multiplier, "--noise-multiplier")
    epochs = check_int("--epochs", args.epochs, minimum=1)
    delta = check_delta(args.delta, "--delta")
    dim = None if args.dimension is None else check_int("--dimension", args.dimension, minimum=1)
    if args.drop_last and n - 1 < b:
        raise ValueError(
            f"`--batch-size` must be < `--dataset-size` with --drop-last (the neighbour N - 1 "
            f"must fill a batch), got {b} and {n}."
        )
    row = opacus1x_batch_arithmetic(n, b, drop_last=args.drop_last)
    steps = epochs * row.steps_per_epoch  # len(DPDataLoader) batches per epoch
    verdict = feasgm_verdict(n, b, drop_last=args.drop_last)
    sgm = standard_epsilon(delta, steps=steps, sample_rate=row.accountant_rate, noise_multiplier=sigma)
    sgm_model = (
        f"SGM (Poisson-subsampled Gaussian, PLD accountant, q = 1/{row.steps_per_epoch} as "
        "Opacus 1.x accounts it, divisor ignored)"
    )
    if verdict.safe:
        corrected, corrected_model = sgm, "FEASGM corrected: safe, the SGM guarantee holds exactly"
    else:
        corrected, corrected_model = math.inf, "FEASGM corrected: unsafe, no finite guarantee"
    curve = None
    if dim is not None:
        value = feasgm_epsilon(
            delta,
            dataset_size=n,
            batch_size=b,
            noise_multiplier=sigma,
            steps=steps,
            dimension=dim,
            drop_last=args.drop_last,
        )
        curve = {"epsilon": value, "model": FEASGM_MODEL.format(dimension=dim)}
    asgm_q = row.sampler_rate
    asgm = asgm_epsilon(
        delta, dataset_size=n, sample_rate=asgm_q, noise_multiplier=sigma, steps=steps
    )
    return {
        "configuration": {
            "dataset_size": n,
            "batch_size": b,
            "noise_multiplier": sigma,
            "epochs": epochs,
            "delta": delta,
            "dimension": dim,
            "drop_last": bool(args.drop_last),
        },
        "steps_per_epoch": row.steps_per_epoch,
        "steps": steps,
        "sample_rate": row.accountant_rate,
        "sampler_rate": row.sampler_rate,
        "expected_batch_size": row.expected_batch_size,
        "sgm": {"epsilon": sgm, "model": sgm_model},
        "feasgm_verdict": {
            "verdict": verdict.verdict,
            "rule": verdict.rule,
            "dataset_sizes": list(verdict.dataset_sizes),
            "divisors": list(verdict.divisors),
            "sample_rates": list(verdict.sample_rates),
            "accountant_rates": list(verdict.accountant_rates),
            "steps_per_epoch": list(verdict.steps_per_epoch or ()),
            "reason": verdict.reason,
            "model": "FEASGM verdict (Opacus 1.x divisor int(N * q), neighbours N - 1, N, N + 1)",
        },
        "corrected": {"epsilon": corrected, "model": corrected_model, "reason": verdict.reason},
        "curve": curve,
        "asgm": {
            "epsilon": asgm,
            "sample_rate": asgm_q,
            "model": f"{ASGM_MODEL}, Opacus 0.x divisor |B|, q = 1/{row.loader_length}",
        },
    }


def _run_normalisation(args: argparse.Namespace) -> int:
    report = _normalisation_report(args)
    if args.json:
        payload = dict(report)
        for key in ("sgm", "corrected", "curve", "asgm"):
            if payload[key] is not None:
                payload[key] = {**payload[key], "epsilon": _json_number(payload[key]["epsilon"])}
        print(json.dumps(payload, allow_nan=False))
        return 0
    c, v = report["configuration"], report["feasgm_verdict"]
    print(
        f"Opacus 1.x make_private(poisson_sampling=True): N = {c['dataset_size']}, "
        f"L = {c['batch_size']}, sigma = {c['noise_multiplier']:g}, {c['epochs']} epoch(s) x "
        f"{report['steps_per_epoch']} steps = {report['steps']} steps, delta = {c['delta']:g}"
    )
    print(f"  SGM epsilon        {_fmt_eps(report['sgm']['epsilon'])}   [{report['sgm']['model']}]")
    print(f"  FEASGM verdict     {v['verdict']:>10}   [{v['model']}]")
    print(f"      {'N':>12} {'divisor':>10} {'sample rate':>14} {'steps/epoch':>12}")
    for i, size in enumerate(v["dataset_sizes"]):
        print(
            f"      {size:>12} {v['divisors'][i]:>10g} {v['sample_rates'][i]:>14.8g} "
            f"{v['steps_per_epoch'][i]:>12}"
        )
    print(f"      reason: {v['reason']}")
    corr = report["corrected"]
    print(f"  corrected epsilon  {_fmt_eps(corr['epsilon'])}   [{corr['model']}]")
    if report["curve"] is not None:
        print(f"  curve epsilon      {_fmt_eps(report['curve']['epsilon'])}   [{report['curve']['model']}]")
    asgm = report["asgm"]
    print(f"  ASGM epsilon       {_fmt_eps(asgm['epsilon'])}   [{asgm['model']}]")
    return 0


def _run_compare_versions(args: argparse.Namespace) -> int:
    from opacus_lastiterate.analysis.opacus_versions import (
        ACCOUNTANT_LABELS,
        VersionConfig,
        compare_versions,
        installed_version,
    )

    config = VersionConfig(
        dataset_size=args.dataset_size,
        batch_size=args.batch_size,
        noise_multiplier=args.noise_multiplier,
        delta=args.delta,
        epochs=None if args.steps is not None else (args.epochs or 1),
        steps=args.steps,
        dimension=args.dimension,
        poisson=not args.no_poisson,
        loss_reduction=args.loss_reduction,
        drop_last=args.drop_last,
    )
    rows = compare_versions(config, args.versions)
    if args.plot:
        _plot_versions(rows, args.plot)
    if args.json:
        print(json.dumps({
            "configuration": {k: getattr(config, k) for k in config.__dataclass_fields__},
            "installed": installed_version(),
            "accountants": ACCOUNTANT_LABELS,
            "rows": [r.as_dict() for r in rows],
        }, allow_nan=False))
        return 0
    span = f"{config.steps} steps" if config.steps is not None else f"{config.epochs} epoch(s)"
    print(
        f"N = {config.dataset_size}, L = {config.batch_size}, sigma = {config.noise_multiplier:g}, "
        f"{span}, delta = {config.delta:g}, {'Poisson' if config.poisson else 'shuffled'}, "
        f"loss_reduction = {config.loss_reduction}; installed opacus: {installed_version()}"
    )
    curve = any(r.curve is not None for r in rows)
    print(f"{'version':<8} {'mechanism':<17} {'accountant':<13} {'q':>10} {'steps':>6} "
          f"{'divisor':<26} {'reported':>9} {'corrected':>10} {'heuristic':>9}"
          + (f" {'curve':>9}" if curve else ""))
    for r in rows:
        line = (f"{r.version:<8} {r.mechanism:<17} {r.accountant:<13} {r.sample_rate:>10.6g} "
                f"{r.steps:>6} {r.divisor:<26} {_fmt_eps(r.reported)[1:]} {_fmt_eps(r.corrected)} "
                f"{_fmt_eps(r.heuristic)[1:]}")
        if curve:
            line += " " + (_fmt_eps(r.curve)[1:] if r.curve is not None else f"{'-':>9}")
        print(line)
        for w in r.warnings:
            print(f"         ! {w}")
    print("corrected models:")
    for model in dict.fromkeys(r.corrected_model for r in rows):
        print(f"  - {model}")
    print("accountants: " + "; ".join(f"{k}: {v}" for k, v in ACCOUNTANT_LABELS.items()))
    print("heuristic: last-iterate heuristic at the accountant's q (final model only; SGM assumed)")
    return 0


def _plot_versions(rows: list[Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib (pip install matplotlib).") from None
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(10, 4))
    for key, style in (("reported", "o-"), ("corrected", "s--"), ("heuristic", "^:")):
        ys = [getattr(r, key) for r in rows]
        ax.plot(xs, [y if math.isfinite(y) else float("nan") for y in ys], style, label=key)
        for x, y in zip(xs, ys):
            if not math.isfinite(y):
                ax.annotate("inf", (x, 0), textcoords="offset points", xytext=(0, 5), ha="center")
    ax.set_xticks(xs, [r.version for r in rows], rotation=60)
    ax.set_ylabel("epsilon")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, TypeError) as err:
        parser.exit(2, f"opacus-lastiterate {args.command}: error: {err}\n")
    return 0  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
