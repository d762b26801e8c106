"""``opacus-lastiterate epsilon``: every privacy number of one DP-SGD configuration.

Three questions, one per option set (``docs/cli.md``, "epsilon"):

* ``--noise-multiplier S --delta D``: epsilon at delta D of the last-iterate heuristic, its
  robust form, the standard composition bound and full-batch DP-GD (plus the schedule- or
  momentum-weighted heuristic with ``--lr-schedule`` / ``--momentum``);
* ``--noise-multiplier S --epsilon E``: delta at epsilon E of the same models;
* ``--target-epsilon E --delta D``: the noise multiplier that meets E for each accountant.

Every model is built by its registry name (:mod:`opacus_lastiterate.analysis.privacy_models`,
through :func:`~opacus_lastiterate.analysis.comparison.compared_models`), for the run the
options describe: :func:`~opacus_lastiterate.analysis.privacy_models.choose` picks each model
for its sampling scheme (``--sampling``: Poisson unless told otherwise) and its per-step
weights (``--lr-schedule``, ``--momentum``); the JSON keys are those names.
"""

from __future__ import annotations

from typing import Any

import click

from opacus_lastiterate.cli._lr_schedule import learning_rates
from opacus_lastiterate.cli._optimizer import (
    adaptive_label,
    adaptive_weights_of,
    calibrate_adaptive,
    optimizer_options,
)
from opacus_lastiterate.cli._options import (
    NON_NEGATIVE,
    POSITIVE,
    STEPS,
    Interval,
    dp_sgd_options,
    emit_json,
    interval_option,
    json_option,
    ordered,
    plot_option,
    writing,
)
from opacus_lastiterate.cli._unit import unit_numbers, unit_options

__all__ = ["WEIGHTED_LABEL", "epsilon"]

WEIGHTED_LABEL = (
    "last-iterate heuristic with the schedule/momentum weights (final model only; exact for "
    "linear losses up to the stated accuracy, rounded up; not a proven bound for deep networks)"
)
CALIBRATION_LABELS = {
    "heuristic": "last-iterate heuristic",
    "robust_heuristic": "robust heuristic (max over the last t <= T steps)",
    "standard": "standard composition (all iterates released, PLD)",
    "full_batch": "full-batch DP-GD",
}
"""Short labels of the calibrated accountants (registry names), for the text table."""
_CALIBRATE_CHOICES = ("heuristic", "robust_heuristic", "standard", "full_batch")
_SAMPLINGS = ("poisson", "shuffled", "deterministic", "balls-in-bins")
_DEFAULT_CALIBRATIONS = ("heuristic", "robust_heuristic", "standard")


def _keys() -> tuple[str, ...]:
    from opacus_lastiterate.analysis.comparison import COMPARED_MODELS

    return COMPARED_MODELS


def _weighted(args: dict[str, Any], quantity: str, argument: float) -> Any:
    """The weighted heuristic (a WeightedHeuristicResult) when schedule/momentum are set: the
    registry's ``"heuristic"`` of the run with the per-step weights of the SGD settings."""
    if not _weighted_requested(args):
        return None
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.analysis.run import DPSGDRun

    run = DPSGDRun.from_history(
        [(args["noise_multiplier"], args["sample_rate"], args["steps"])], weights=_weights(args)
    )
    model = privacy_model("heuristic", run, accuracy=args["accuracy"])
    if quantity == "epsilon":
        return model.epsilon_result(argument)  # type: ignore[attr-defined]
    return model.delta_result(argument)  # type: ignore[attr-defined]


def _weights(args: dict[str, Any]) -> Any:
    """The per-step weights of the optimizer options (None without); reads --lr-schedule."""
    if not _weighted_requested(args):
        return None
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
    if "learning_rates" not in args:
        args["learning_rates"] = learning_rates(
            args["lr_schedule"], args["steps"], args["step_size"], args["gamma"]
        )
    if args["optimizer"] != "sgd":
        return adaptive_weights_of(args)
    return sgd_weights(args["learning_rates"], momentum=args["momentum"],
                       dampening=args["dampening"], nesterov=args["nesterov"])


def _scheme(args: dict[str, Any]) -> Any:
    """The sampling scheme of ``--sampling`` (None for Poisson), checked against
    ``--sample-rate`` and ``--dataset-size`` before anything is computed."""
    name, n, q = args["sampling"], args["dataset_size"], args["sample_rate"]
    if name in ("poisson", "balls-in-bins"):
        if n is not None:
            raise click.UsageError(
                "--dataset-size describes shuffled or deterministic batches: pass "
                "--sampling shuffled or --sampling deterministic."
            )
        if name == "poisson":
            return None
    elif n is None:
        raise click.UsageError(f"--sampling {name} needs --dataset-size.")
    from opacus_lastiterate.analysis.run import DPSGDRun
    from opacus_lastiterate.analysis.sampling import (
        BallsInBins,
        DeterministicBatches,
        ShuffledBatches,
    )

    if name == "balls-in-bins":
        size, what = round(1 / q), "1 / (steps per epoch) with --sampling balls-in-bins"
    else:
        size, what = round(q * n), f"(batch size) / --dataset-size = B / {n}"
    try:
        if name == "balls-in-bins":
            scheme: Any = BallsInBins(steps_per_epoch=max(size, 1))
        else:
            cls = ShuffledBatches if name == "shuffled" else DeterministicBatches
            scheme = cls(dataset_size=n, batch_size=max(size, 1))
        DPSGDRun.constant(steps=1, sample_rate=q, noise_multiplier=1.0, sampling=scheme)
    except ValueError as err:
        raise click.BadParameter(f"must be {what}: {err}", param_hint="'--sample-rate'") from None
    return scheme


def _run(args: dict[str, Any], noise_multiplier: float | None = None) -> Any:
    """The run the options describe (at ``noise_multiplier`` when given)."""
    from opacus_lastiterate.analysis.run import DPSGDRun

    sigma = args["noise_multiplier"] if noise_multiplier is None else noise_multiplier
    return DPSGDRun.constant(
        steps=args["steps"], sample_rate=args["sample_rate"], noise_multiplier=sigma,
        sampling=args["scheme"],
    )


def _labels(run: Any) -> dict[str, str]:
    """The label of each compared model of ``run``: the registry's description, or for
    another scheme than Poisson the label of the model chosen for it (it names the scheme)."""
    from opacus_lastiterate.analysis.comparison import EpsilonComparison, compared_models

    labels = dict(EpsilonComparison.LABELS)
    if run.sampling is not None:
        for name, model in compared_models(run).items():
            labels[name] = model.label or labels[name]
    return labels


def _header(args: dict[str, Any], last: str) -> str:
    scheme = "" if args["scheme"] is None else f"{args['scheme'].describe()}, "
    return (
        f"DP-SGD, T = {args['steps']} steps, q = {args['sample_rate']:g}, {scheme}"
        f"sigma = {args['noise_multiplier']:g}, {last}"
    )


def _comparison(args: dict[str, Any], quantity: str) -> dict[str, Any]:
    """Every compared model's epsilon at --delta (``quantity="epsilon"``) or delta at
    --epsilon, with the models' registry names in order and their labels; a repeated
    configuration is read from the on-disk cache (:mod:`._cache`) without the analysis."""
    from opacus_lastiterate.cli._cache import cached

    def compute() -> dict[str, Any]:
        from opacus_lastiterate.analysis.comparison import compare_epsilons_for_history

        if quantity == "epsilon":
            values = compare_epsilons_for_history(
                args["run"], args["delta"], value_discretization_interval=args["discretization"]
            ).as_dict()
        else:
            values = {k: m.delta(args["epsilon"]) for k, m in _models(args).items()}
        return {"values": values, "keys": list(_keys()), "labels": _labels(args["run"])}

    inputs = {name: args[name] for name in ("steps", "sample_rate", "noise_multiplier",
                                            "discretization")}
    if args["scheme"] is not None:
        inputs["sampling"] = args["scheme"].as_dict()
    inputs.update(quantity=quantity, argument=args["delta" if quantity == "epsilon" else
                                                  "epsilon"])
    extra = _EPSILON_EXTRA if quantity == "epsilon" else ()
    return cached(inputs, compute, lambda entry: _well_formed(entry, extra))


_EPSILON_EXTRA = ("delta", "steps", "standard_discretization")
"""The keys of an epsilon comparison's values besides the models' (``EpsilonComparison``)."""


def _well_formed(entry: dict[str, Any], extra: tuple[str, ...]) -> bool:
    """Whether a cached answer has the shape :func:`_comparison` computes: ``keys`` a non-empty
    list of names, ``values`` exactly those names and ``extra`` mapped to numbers >= 0 (not
    NaN; infinity allowed), ``labels`` a string for each name."""
    values, keys, labels = entry.get("values"), entry.get("keys"), entry.get("labels")
    if not (isinstance(values, dict) and isinstance(keys, list) and isinstance(labels, dict)):
        return False
    if not keys or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        return False
    if set(values) != {*keys, *extra} or not set(keys) <= set(labels):
        return False
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
                  for v in values.values())
    return numbers and all(isinstance(v, str) for v in labels.values())


def _values(args: dict[str, Any], quantity: str) -> None:
    """Print (or emit as JSON) every compared model's epsilon at --delta (``quantity`` is
    ``"epsilon"``) or delta at --epsilon (``"delta"``), and the weighted heuristic when asked."""
    is_eps = quantity == "epsilon"
    argument = args["delta"] if is_eps else args["epsilon"]
    comparison = _comparison(args, quantity)
    values, labels = ordered(comparison["values"]), comparison["labels"]
    weighted = _weighted(args, quantity, argument)
    if is_eps and args["plot"] is not None:
        _plot_curve(args, weighted)
    if args["as_json"]:
        payload: dict[str, Any] = {
            "quantity": quantity,
            "steps": args["steps"],
            "sample_rate": args["sample_rate"],
            **_sampling_key(args),
            "noise_multiplier": args["noise_multiplier"],
            **({} if is_eps else {"epsilon": argument}),
            **values,
            **({} if is_eps else {"standard_discretization": args["discretization"]}),
            "labels": dict(labels),
        }
        if weighted is not None:
            payload["weighted_heuristic"] = weighted.value
            payload["weighted_relative_accuracy"] = weighted.relative_accuracy
            payload["labels"]["weighted_heuristic"] = _weighted_label(args)
            payload.update(_optimizer_key(args))
        emit_json(payload)
        return
    click.echo(_header(args, f"delta = {argument:g}" if is_eps else f"epsilon = {argument:g}"))
    name, fmt = ("eps", "10.4f") if is_eps else ("delta", "11.4e")
    for key in comparison["keys"]:
        click.echo(f"  {key:<17} {name} = {values[key]:{fmt}}   {_label(key, args, labels)}")
    if weighted is not None:
        click.echo(
            f"  {'weighted':<17} {name} = {weighted.value:{fmt}}   {_weighted_label(args)}; "
            f"schedule {args['lr_schedule'] or 'constant'}, {_settings_text(args)}"
            + (f", accuracy {weighted.relative_accuracy:.1e}" if is_eps else "")
        )


def _label(key: str, args: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    if labels is None:
        from opacus_lastiterate.analysis.comparison import EpsilonComparison

        labels = EpsilonComparison.LABELS
    label = labels[key]
    return f"{label} (PLD interval {args['discretization']:g})" if key == "standard" else label


def _models(args: dict[str, Any]) -> dict[str, Any]:
    """The compared privacy models of the configuration (for delta at epsilon)."""
    from opacus_lastiterate.analysis.comparison import compared_models

    return compared_models(args["run"], value_discretization_interval=args["discretization"])


def _calibrate(args: dict[str, Any], accountants: tuple[str, ...]) -> None:
    from opacus_lastiterate.analysis.calibration import calibrate_noise_multiplier
    from opacus_lastiterate.analysis.comparison import compare_epsilons_for_history

    target, delta = args["target_epsilon"], args["delta"]
    rows = []
    for accountant in accountants:
        sigma = calibrate_noise_multiplier(
            target,
            delta,
            steps=args["steps"],
            sample_rate=args["sample_rate"],
            accountant=accountant,  # type: ignore[arg-type]
            sampling=args["scheme"],
            value_discretization_interval=args["discretization"],
        )
        run = _run(args, sigma)
        result = compare_epsilons_for_history(
            run, delta, value_discretization_interval=args["discretization"]
        )
        rows.append(ordered({"accountant": accountant, "noise_multiplier": sigma,
                             **{k: getattr(result, k) for k in _keys()}}))
    if args["as_json"]:
        emit_json({
            "quantity": "noise_multiplier",
            "target_epsilon": target,
            "delta": delta,
            "steps": args["steps"],
            "sample_rate": args["sample_rate"],
            **_sampling_key(args),
            "standard_discretization": args["discretization"],
            "calibrations": rows,
            "labels": {**_labels(run),
                       "noise_multiplier": "smallest sigma (to 1e-4 relative, rounded up) "
                       "whose epsilon under `accountant` is at most the target"},
        })
        return
    from opacus_lastiterate.figures import Column, FigureResult

    table = FigureResult(
        name="epsilon",
        title=(
            f"DP-SGD, T = {args['steps']} steps, q = {args['sample_rate']:g}: the noise "
            f"multiplier for epsilon <= {target:g} at delta = {delta:g}, and every epsilon at it"
        ),
        settings={},
        columns=[Column("accountant", "calibrated to", ""), Column("noise_multiplier", "sigma",
                 ".4f"), *(Column(k, k.replace("_heuristic", "").replace("_", " "), ".4f")
                 for k in _keys())],
        rows=rows,
        labels={
            **{a: CALIBRATION_LABELS[a] for a in accountants},
            "sigma": "smallest noise multiplier meeting the target (to 1e-4 relative, rounded "
            "up)",
            "epsilons": "the heuristic ones describe the final model only and are not a "
            "proven bound for deep networks",
        },
    )
    click.echo(table.table())


def _sampling_key(args: dict[str, Any]) -> dict[str, Any]:
    """``{"sampling": scheme as a dict}`` for another scheme than Poisson, else nothing."""
    return {} if args["scheme"] is None else {"sampling": args["scheme"].as_dict()}


def _plot_curve(args: dict[str, Any], weighted: Any) -> None:
    """The four epsilons against t = 1..T (``--plot``), and the weighted heuristic at T when
    the table has it: the plot shows every value the table prints."""
    from opacus_lastiterate.figures import last_iterate_fig1 as fig1
    from opacus_lastiterate.figures._plotting import OKABE_ITO, legend_below, pyplot, save

    path = args["plot"]
    delta = args["delta"]
    rows = [ordered(row) for row in fig1.curve(
        delta,
        sample_rate=args["sample_rate"],
        noise_multiplier=args["noise_multiplier"],
        steps=fig1.steps_grid(max(args["steps"], 1)),
        value_discretization_interval=args["discretization"],
    )]
    with writing(path, "--plot"):
        fig, ax = pyplot().subplots(figsize=(6, 4.2))
        fig1.draw_panel(ax, rows, delta, f"epsilon against T: q = {args['sample_rate']:g}, "
                        f"sigma = {args['noise_multiplier']:g}")
        if weighted is not None:
            ax.plot([args["steps"]], [weighted.epsilon], linestyle="none", marker="*", ms=11,
                    color=OKABE_ITO[6],
                    label=f"weighted heuristic at T = {args['steps']} (schedule "
                    f"{args['lr_schedule'] or 'constant'}, momentum {args['momentum']:g})")
        legend_below(fig, ax, ncol=2)
        save(fig, path)
    click.echo(f"saved plot: {path}", err=args["as_json"])


@click.command(short_help="Epsilon at delta, delta at epsilon, or sigma for a target.")
@dp_sgd_options(noise_required=False, delta_required=False)
@click.option("--epsilon", type=NON_NEGATIVE, default=None,
              help="Give delta at this epsilon instead of epsilon at --delta.")
@click.option("--target-epsilon", type=POSITIVE, default=None,
              help="Calibrate: the noise multiplier that meets this epsilon at --delta (with "
              "--optimizer adam, adamw, ...: on the adaptive heuristic, C / B = 1).")
@click.option("--calibrate", "calibrate", multiple=True,
              type=click.Choice(list(_CALIBRATE_CHOICES)),
              help="With --target-epsilon: the accountant(s) to calibrate (repeatable; "
              "default heuristic, robust_heuristic and standard).")
@interval_option("Value discretisation interval of the PLD accountant (standard epsilon). "
                 "Any interval gives an upper bound; a coarser one "
                 "is faster but can be much looser when the per-step privacy loss is small "
                 "(1e-3 is 29% above 1e-4 at q = 0.001, sigma = 2).")
@click.option("--sampling", type=click.Choice(list(_SAMPLINGS)), default="poisson",
              show_default=True,
              help="How the batches are drawn (docs/samplers.md): Poisson at --sample-rate, "
              "shuffled or deterministic batches of --sample-rate x --dataset-size records, or "
              "balls-in-bins with 1 / --sample-rate steps an epoch; every number is the one of "
              "that scheme.")
@click.option("--dataset-size", type=STEPS, default=None,
              help="Number of records N (with --sampling shuffled or deterministic).")
@click.option("--lr-schedule", default=None, metavar="NAME|FILE",
              help="Learning-rate schedule: constant, step (StepLR: --step-size, --gamma), "
              "cosine (CosineAnnealingLR over T), or a text file with one rate per step "
              "(separated by white space or commas; # starts a comment); adds "
              "the weighted heuristic (docs/last_iterate.md, 'Per-step weights: schedules "
              "and momentum').")
@click.option("--momentum", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Heavy-ball momentum of torch SGD (adds the weighted heuristic).")
@click.option("--dampening", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Momentum dampening of torch SGD.")
@click.option("--nesterov", is_flag=True, help="Nesterov momentum (torch SGD).")
@click.option("--step-size", type=STEPS, default=None,
              help="StepLR step size [default: T / 3].")
@click.option("--gamma", type=POSITIVE, default=0.1, show_default=True,
              help="StepLR decay factor.")
@click.option("--accuracy", type=Interval(0.0, 1.0), default=1e-3, show_default=True,
              help="Relative accuracy of the weighted heuristic.")
@optimizer_options
@unit_options
@json_option
@plot_option("the four epsilons against the number of steps t = 1..T", "epsilon.png")
def epsilon(**args: Any) -> None:
    """Heuristic, robust, standard and full-batch epsilon of T steps of DP-SGD.

    \b
    epsilon at delta:   --noise-multiplier S --delta D
    delta at epsilon:   --noise-multiplier S --epsilon E
    calibrate sigma:    --target-epsilon E --delta D [--calibrate heuristic|robust_heuristic|...]
                        [--optimizer adamw --lr-schedule ...: the adaptive heuristic]
    a user's records:   --records-per-user K (or --group-size K) with --delta or --epsilon

    The heuristic describes the final model only and is exact for linear losses, not a proven
    bound for deep networks; the standard epsilon is the proven bound when every iterate is
    released.
    """
    noise, delta, eps, target = (
        args["noise_multiplier"], args["delta"], args["epsilon"], args["target_epsilon"]
    )
    _check_optimizer_options(args)
    args["scheme"] = _scheme(args)
    if args["scheme"] is not None and (args["plot"] is not None or _weighted_requested(args)):
        raise click.UsageError(
            f"--sampling {args['sampling']} gives the numbers of that scheme for a constant "
            "learning rate: leave out --plot, --lr-schedule, --momentum, --dampening and "
            f"--nesterov{_and_optimizer(args)} (the weighted heuristic of an epoch scheme: "
            "privacy_model('heuristic', run) in Python)."
        )
    if _weighted_requested(args):  # a bad schedule file is reported before any computation
        args["learning_rates"] = learning_rates(args["lr_schedule"], args["steps"],
                                                 args["step_size"], args["gamma"])
    if unit_numbers(args, lambda: _weights(args)):
        return  # the numbers of a user or a group (cli/_unit.py)
    if target is not None:
        if noise is not None or eps is not None:
            raise click.UsageError(
                "--target-epsilon finds the noise multiplier: leave out --noise-multiplier "
                "and --epsilon."
            )
        if delta is None:
            raise click.UsageError("--target-epsilon needs --delta.")
        if args["optimizer"] != "sgd" and args["plot"] is None:  # the adaptive heuristic
            return calibrate_adaptive(args)
        if args["plot"] is not None or _weighted_requested(args):
            raise click.UsageError(
                "--target-epsilon calibrates the constant-rate accountants: leave out --plot, "
                f"--lr-schedule, --momentum, --dampening and --nesterov{_and_optimizer(args)}."
            )
        _calibrate(args, tuple(args["calibrate"]) or _DEFAULT_CALIBRATIONS)
        return
    if args["calibrate"]:
        raise click.UsageError("--calibrate needs --target-epsilon.")
    if noise is None:
        raise click.UsageError(
            "Missing option '--noise-multiplier' (or pass --target-epsilon to calibrate it)."
        )
    if (delta is None) == (eps is None):
        raise click.UsageError(
            "Pass exactly one of --delta (epsilon at delta) and --epsilon (delta at epsilon)."
        )
    if delta is None and args["plot"] is not None:
        raise click.UsageError("--plot draws epsilon against T at --delta: pass --delta.")
    args["run"] = _run(args)
    _values(args, "epsilon" if delta is not None else "delta")


def _check_optimizer_options(args: dict[str, Any]) -> None:
    """The adaptive options need --optimizer other than sgd."""
    if args["optimizer"] == "sgd":
        given = [f"--{k.replace('_', '-')}" for k in ("beta1", "beta2", "adam_eps", "noise_std")
                 if args[k] is not None] + (["--weight-decay"] if args["weight_decay"] else [])
        if args["base_lr"] is not None:
            given.append("--lr")
        if given:
            raise click.UsageError(
                f"{', '.join(given)}: options of an adaptive optimizer; pass --optimizer adam, "
                "adamw, ... (torch SGD's weights read --momentum, --dampening, --nesterov)."
            )


def _weighted_requested(args: dict[str, Any]) -> bool:
    return bool(args["lr_schedule"] is not None or args["momentum"] or args["dampening"]
                or args["nesterov"] or args["optimizer"] != "sgd")


def _and_optimizer(args: dict[str, Any]) -> str:
    return "" if args["optimizer"] == "sgd" else f" (and --optimizer {args['optimizer']})"


def _weighted_label(args: dict[str, Any]) -> str:
    return WEIGHTED_LABEL if args["optimizer"] == "sgd" else adaptive_label()


def _settings_text(args: dict[str, Any]) -> str:
    if args["optimizer"] == "sgd":
        return f"momentum {args['momentum']:g}"
    return f"optimizer {args['optimizer']}"


def _optimizer_key(args: dict[str, Any]) -> dict[str, Any]:
    """``{"optimizer": ...}`` with the adaptive settings given, for an adaptive optimizer."""
    if args["optimizer"] == "sgd":
        return {}
    keys = ("base_lr", "beta1", "beta2", "adam_eps", "weight_decay", "noise_std")
    return {"optimizer": {"name": args["optimizer"],
                          **{k: args[k] for k in keys if args[k] is not None}}}

