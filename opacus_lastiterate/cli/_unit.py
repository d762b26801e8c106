"""``opacus-lastiterate epsilon --records-per-user K`` / ``--group-size K``: the numbers of a
privacy unit of more than one record (``docs/privacy_units.md``, ``docs/cli.md``).

The unit is one more input of the run the options describe
(:class:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit` in
:class:`~opacus_lastiterate.analysis.run.DPSGDRun`); the registry
(:func:`~opacus_lastiterate.analysis.privacy_models.privacy_model`) chooses each model for it.
Only the names with a model for such a unit are computed: :data:`UNIT_MODELS`, the
last-iterate heuristic (weighted by ``--lr-schedule`` / ``--momentum`` / ``--optimizer`` when
given) and the standard composition bound; each is printed with its model's label, which names
the unit and the sampling scheme.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from opacus_lastiterate.cli._options import COUNT, emit_json, fmt_eps

__all__ = ["UNIT_MODELS", "check_unit_request", "unit_numbers", "unit_of_options", "unit_options"]

UNIT_MODELS: tuple[str, ...] = ("heuristic", "standard")
"""The registry names computed for a unit of more than one record (the others have no model
for it)."""


def unit_options(f: Any) -> Any:
    """``--records-per-user`` and ``--group-size`` (at most one of them)."""
    f = click.option(
        "--group-size", type=COUNT, default=None,
        help="Group privacy: the numbers for any K records at once (the same numbers as "
        "--records-per-user K, labelled as a group; docs/privacy_units.md).",
    )(f)
    return click.option(
        "--records-per-user", type=COUNT, default=None,
        help="User-level privacy: the numbers for one user who owns at most K records, each "
        "record sampled as the run samples records (docs/privacy_units.md). Gives the "
        "heuristic and the standard epsilon of that unit.",
    )(f)


def unit_of_options(args: dict[str, Any]) -> Any:
    """The :class:`PrivacyUnit` of ``--records-per-user`` / ``--group-size`` (None: neither,
    one record)."""
    per_user: int | None = args.get("records_per_user")
    group: int | None = args.get("group_size")
    if per_user is not None and group is not None:
        raise click.UsageError("Pass at most one of --records-per-user and --group-size.")
    if per_user is None and group is None:
        return None
    from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit

    if per_user is not None:
        return PrivacyUnit.user(per_user)
    assert group is not None
    return PrivacyUnit.group(group)


def check_unit_request(args: dict[str, Any], unit: Any) -> None:
    """Usage errors of the options given with ``unit`` (before anything is read or computed)."""
    flag = "--records-per-user" if unit.kind == "user" else "--group-size"
    if args["target_epsilon"] is not None or args["calibrate"]:
        raise click.UsageError(
            f"{flag} gives epsilon at --delta or delta at --epsilon; calibrating the noise for "
            "a unit is not offered here (leave out --target-epsilon and --calibrate)."
        )
    if args["plot"] is not None:
        raise click.UsageError(f"{flag}: leave out --plot (it draws the record-level curve).")
    if args["noise_multiplier"] is None:
        raise click.UsageError(f"{flag} needs --noise-multiplier.")
    if (args["delta"] is None) == (args["epsilon"] is None):
        raise click.UsageError(
            "Pass exactly one of --delta (epsilon at delta) and --epsilon (delta at epsilon)."
        )


def unit_numbers(args: dict[str, Any], weights_of: Callable[[], Any]) -> bool:
    """Print (or emit as JSON) the :data:`UNIT_MODELS` numbers of the run of ``args`` (its
    ``scheme`` already checked) for the unit of its options, with the per-step weights
    ``weights_of()`` (None: constant rate), and return True; False, with nothing done,
    without a unit option."""
    unit = unit_of_options(args)
    if unit is None:
        return False
    check_unit_request(args, unit)
    weights = weights_of()
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.analysis.run import DPSGDRun

    run = DPSGDRun.from_history(
        [(args["noise_multiplier"], args["sample_rate"], args["steps"])],
        weights=weights, sampling=args["scheme"], unit=unit,
    )  # fmt: skip
    params = {
        "heuristic": {"accuracy": args["accuracy"]},
        "standard": {"value_discretization_interval": args["discretization"]},
    }
    models = {name: privacy_model(name, run, **params[name]) for name in UNIT_MODELS}
    quantity = "epsilon" if args["delta"] is not None else "delta"
    argument = args["delta"] if quantity == "epsilon" else args["epsilon"]
    values = {
        name: (m.epsilon(argument) if quantity == "epsilon" else m.delta(argument))
        for name, m in models.items()
    }
    labels = {name: str(m.label) for name, m in models.items()}
    if weights is not None:
        labels["heuristic"] += (
            f"; with the per-step weights of the optimizer options, rounded up to within "
            f"{args['accuracy']:g} relative"
        )
    if args["scheme"] is None:
        labels["standard"] += f" (PLD interval {args['discretization']:g})"
    if args["as_json"]:
        emit_json({
            "quantity": quantity,
            "steps": args["steps"],
            "sample_rate": args["sample_rate"],
            **({} if args["scheme"] is None else {"sampling": args["scheme"].as_dict()}),
            "noise_multiplier": args["noise_multiplier"],
            ("delta" if quantity == "epsilon" else "epsilon"): argument,
            "privacy_unit": unit.as_dict(),
            **values,
            "labels": labels,
        })
        return True
    scheme = "" if args["scheme"] is None else f"{args['scheme'].describe()}, "
    given = f"delta = {argument:g}" if quantity == "epsilon" else f"epsilon = {argument:g}"
    click.echo(
        f"DP-SGD, T = {args['steps']} steps, q = {args['sample_rate']:g}, {scheme}sigma = "
        f"{args['noise_multiplier']:g}, {given}; privacy unit: {unit.describe()}"
    )
    for name in UNIT_MODELS:
        shown = fmt_eps(values[name]) if quantity == "epsilon" else f"{values[name]:11.4e}"
        click.echo(f"  {name:<17} {'eps' if quantity == 'epsilon' else 'delta'} = {shown}   "
                   f"{labels[name]}")
    return True
