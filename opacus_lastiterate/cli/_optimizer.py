"""The ``--optimizer`` options of ``opacus-lastiterate epsilon``: the per-step weights of an
adaptive optimizer's run (Adam, AdamW, ...; ``docs/adaptive_optimizers.md``) from the command
line's learning rates and settings, and the calibration of its noise multiplier
(``--target-epsilon`` with ``--optimizer``: :func:`calibrate_adaptive`)."""

from __future__ import annotations

from typing import Any

import click

from opacus_lastiterate.cli._options import NON_NEGATIVE, POSITIVE

__all__ = [
    "OPTIMIZERS",
    "adaptive_label",
    "adaptive_weights_of",
    "calibrate_adaptive",
    "optimizer_options",
]

OPTIMIZERS = ("sgd", "adam", "adamw", "nadam", "radam", "adamax", "rmsprop", "adagrad")


def optimizer_options(command: Any) -> Any:
    """Add --optimizer, --lr, --beta1, --beta2, --adam-eps, --weight-decay and --noise-std."""
    for option in reversed((
        click.option("--optimizer", type=click.Choice(list(OPTIMIZERS)), default="sgd",
                     show_default=True,
                     help="torch optimizer: sgd, or an adaptive one whose weights freeze the "
                     "second moment at its expectation under the noise (adds the adaptive "
                     "heuristic; docs/adaptive_optimizers.md)."),
        click.option("--lr", "base_lr", type=POSITIVE, default=None,
                     help="With --optimizer: the base learning rate, multiplying the schedule "
                     "(peak 1) or the rates of a --lr-schedule file; only its product with "
                     "--weight-decay changes the weights [default: 1e-3 for a named "
                     "schedule, 1 for a file]."),
        click.option("--beta1", type=NON_NEGATIVE, default=None,
                     help="First-moment decay (Adam's betas[0], RMSprop's momentum) "
                     "[default: torch's]."),
        click.option("--beta2", type=NON_NEGATIVE, default=None,
                     help="Second-moment decay (Adam's betas[1], RMSprop's alpha) "
                     "[default: torch's]."),
        click.option("--adam-eps", type=NON_NEGATIVE, default=None,
                     help="The adaptive optimizer's eps [default: torch's]."),
        click.option("--weight-decay", type=NON_NEGATIVE, default=0.0, show_default=True,
                     help="Weight decay of the adaptive optimizer (decoupled for adamw)."),
        click.option("--noise-std", type=POSITIVE, default=None,
                     help="Noise std on one coordinate of the averaged gradient, "
                     "sigma x max_grad_norm / expected batch size (what eps is compared "
                     "with) [default: sigma, i.e. C / B = 1]."),
    )):
        command = option(command)
    return command


def adaptive_label() -> str:
    """The label of the adaptive heuristic in the CLI's output."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
        ADAPTIVE_HEURISTIC_LABEL,
    )

    return (
        f"last-iterate {ADAPTIVE_HEURISTIC_LABEL} (final model only; an approximation on top "
        "of a heuristic, rounded up; not a proven bound)"
    )


def adaptive_weights_of(args: dict[str, Any]) -> Any:
    """The weights of ``args['optimizer']`` at ``args['learning_rates']`` (unit base rate),
    with the command line's settings; a bad combination is a usage error naming the option."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import adaptive_weights

    settings = _adaptive_settings_of(args)
    std = args["noise_std"] if args["noise_std"] is not None else args["noise_multiplier"]
    try:
        return adaptive_weights(settings, noise_std=std)
    except ValueError as err:
        raise click.UsageError(f"--optimizer {args['optimizer']}: {err}") from None


def calibrate_adaptive(args: dict[str, Any]) -> None:
    """``--target-epsilon`` with an adaptive ``--optimizer``: the smallest noise multiplier
    whose adaptive heuristic (the optimizer's weights at ``args['learning_rates']``) meets the
    target, with C / B = 1 (the command line's convention: the noise std is sigma), and the
    standard epsilon at it; printed as a table or JSON, labelled."""
    from opacus_lastiterate.analysis.calibration import calibrate_noise_multiplier
    from opacus_lastiterate.analysis.comparison import EpsilonComparison
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.analysis.run import DPSGDRun
    from opacus_lastiterate.cli._options import emit_json

    name = args["optimizer"]
    if args["noise_std"] is not None or set(args["calibrate"]) - {"heuristic"}:
        raise click.UsageError(
            f"--target-epsilon with --optimizer {name} calibrates the adaptive heuristic with "
            "C / B = 1: leave out --noise-std and --calibrate other than heuristic."
        )
    settings = _adaptive_settings_of(args)
    target, delta, steps, q = (args["target_epsilon"], args["delta"], args["steps"],
                               args["sample_rate"])
    interval = args["discretization"]
    try:
        sigma = calibrate_noise_multiplier(target, delta, steps=steps, sample_rate=q,
                                           optimizer_settings=settings, noise_scale=1.0)
    except ValueError as err:
        raise click.UsageError(f"--optimizer {name}: {err}") from None
    standard = privacy_model("standard", DPSGDRun.from_history([(sigma, q, steps)]),
                             value_discretization_interval=interval).epsilon(delta)
    labels = {"heuristic": adaptive_label(), "standard": EpsilonComparison.LABELS["standard"]}
    if args["as_json"]:
        emit_json({
            "quantity": "noise_multiplier", "target_epsilon": target, "delta": delta,
            "steps": steps, "sample_rate": q, "standard_discretization": interval,
            "calibrations": [{"accountant": "heuristic", "noise_multiplier": sigma,
                              "standard": standard}],
            "labels": {**labels, "noise_multiplier": "smallest sigma (to 1e-4 relative, "
                       "rounded up) whose adaptive heuristic is at most the target"},
            "optimizer": {"name": name, "schedule": args["lr_schedule"] or "constant"},
        })
        return
    click.echo(f"DP-SGD, T = {steps} steps, q = {q:g}, optimizer {name}, schedule "
               f"{args['lr_schedule'] or 'constant'}: the noise multiplier for epsilon <= "
               f"{target:g} at delta = {delta:g}")
    click.echo(f"  heuristic  sigma = {sigma:10.4f}   {labels['heuristic']}")
    click.echo(f"  standard   eps = {standard:12.4f}   at that sigma: {labels['standard']}")


def _adaptive_settings_of(args: dict[str, Any]) -> Any:
    """One AdaptiveSettings per step of ``args['learning_rates']`` (usage errors named)."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings

    name = args["optimizer"]
    if name == "sgd":
        raise click.UsageError("--optimizer sgd has no adaptive weights.")
    if args["momentum"] or args["dampening"] or args["nesterov"]:
        raise click.UsageError(
            f"--momentum, --dampening and --nesterov are torch SGD's: with --optimizer {name} "
            "give --beta1 (RMSprop's momentum) instead."
        )
    options: dict[str, Any] = {"weight_decay": args["weight_decay"]}
    defaults = {"rmsprop": (0.0, 0.99)}.get(name, (0.9, 0.999))
    beta1 = args["beta1"] if args["beta1"] is not None else defaults[0]
    beta2 = args["beta2"] if args["beta2"] is not None else defaults[1]
    if name != "adagrad":
        options.update(beta1=beta1, beta2=beta2)
    elif args["beta1"] is not None or args["beta2"] is not None:
        raise click.UsageError("--beta1 and --beta2 are not options of adagrad.")
    if args["adam_eps"] is not None:
        options["eps"] = args["adam_eps"]
    elif name == "adagrad":
        options["eps"] = 1e-10
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import BUILTIN_SCHEDULES

    named = (args["lr_schedule"] or "constant") in BUILTIN_SCHEDULES
    base = args["base_lr"] if args["base_lr"] is not None else (1e-3 if named else 1.0)
    try:
        return [AdaptiveSettings(name, base * float(lr), **options)
                for lr in args["learning_rates"]]
    except ValueError as err:
        raise click.UsageError(f"--optimizer {name}: {err}") from None
