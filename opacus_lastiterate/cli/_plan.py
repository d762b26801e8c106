"""``opacus-lastiterate plan``: batch sizes with equal heuristic epsilon, each with its noise
multiplier and standard epsilon (``docs/cli.md``, "plan")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from opacus_lastiterate.cli._options import (
    COUNT,
    POSITIVE,
    PROBABILITY,
    check_batch_size,
    emit_json,
    interval_option,
    json_option,
    ordered,
    plot_option,
    writing,
)

__all__ = ["plan"]


class _IntList(click.ParamType):
    """Comma-separated positive integers, e.g. ``4096,512,256``."""

    name = "integers"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (list, tuple)):
            return list(value)
        try:
            sizes = [int(part) for part in str(value).split(",") if part.strip()]
        except ValueError:
            self.fail(f"must be comma-separated integers such as 4096,512,256, got {value!r}.",
                      param, ctx)
        if not sizes or min(sizes) < 1:
            self.fail(f"must be integers >= 1, got {value!r}.", param, ctx)
        return sizes


_COLUMNS = (
    ("batch_size", "B", "d"),
    ("sample_rate", "q", ".4g"),
    ("steps", "T", "d"),
    ("epochs", "epochs", ".1f"),
    ("noise_multiplier", "sigma", ".4f"),
    ("noise_per_example", "sigma/B", ".2e"),
    ("heuristic", "heuristic", ".3f"),
    ("robust_heuristic", "robust", ".3f"),
    ("standard", "standard", ".3f"),
    ("full_batch", "full batch", ".3f"),
)


@click.command(short_help="Batch sizes with equal heuristic epsilon (Table 1).")
@click.option("--dataset-size", type=COUNT, required=True, help="N, the number of records.")
@click.option("--batch-sizes", type=_IntList(), required=True, metavar="B1,B2,...",
              help="Expected batch sizes to compare, comma-separated (each <= N).")
@click.option("--target-epsilon", type=POSITIVE, required=True,
              help="The epsilon every batch size meets (heuristic by default).")
@click.option("--delta", type=PROBABILITY, required=True, help="Target delta in (0, 1).")
@click.option("--epochs", type=POSITIVE, default=None,
              help="Passes over the data: T = round(epochs * N / B) for each B.")
@click.option("--steps", type=COUNT, default=None,
              help="The same number of steps T for every batch size (instead of --epochs).")
@click.option("--accountant",
              type=click.Choice(["heuristic", "robust_heuristic", "standard"]),
              default="heuristic", show_default=True,
              help="What the noise is calibrated to.")
@interval_option("Value discretisation interval of the PLD accountant (standard epsilon).")
@json_option
@plot_option("the epsilons and the noise per example against the batch size", "plan.png")
def plan(
    dataset_size: int, batch_sizes: list[int], target_epsilon: float, delta: float,
    epochs: float | None, steps: int | None, accountant: str, discretization: float,
    as_json: bool, plot: Path | None,
) -> None:
    """Noise multiplier and steps per batch size for one target heuristic epsilon.

    Like Table 1 of the last-iterate paper (arXiv 2410.06186): batch sizes whose heuristic
    epsilon is equal, with the standard epsilon each of them gets. Sample rate q = B / N
    (Poisson sampling). The heuristic describes the final model only and is not a proven
    bound for deep networks; the standard column is the proven bound for releasing every
    iterate.

    \b
    Example (CIFAR-10 sizes):
      opacus-lastiterate plan --dataset-size 50000 --epochs 200 \\
          --batch-sizes 4096,1024,512,256 --target-epsilon 6 --delta 1e-5
    """
    from opacus_lastiterate.analysis.hyperparameter_plan import plan_batch_sizes

    if (epochs is None) == (steps is None):
        raise click.UsageError("Pass exactly one of --epochs and --steps.")
    for size in batch_sizes:
        check_batch_size(size, dataset_size, option="--batch-sizes")
    rows = [
        ordered(p.as_dict())
        for p in plan_batch_sizes(
            target_epsilon, delta, dataset_size=dataset_size, batch_sizes=batch_sizes,
            epochs=epochs, steps=steps, accountant=accountant,  # type: ignore[arg-type]
            value_discretization_interval=discretization,
        )
    ]
    if plot is not None:
        from opacus_lastiterate.figures.last_iterate_table1 import plot_plan

        path = plot
        with writing(path, "--plot"):
            plot_plan(rows, delta, path)
        click.echo(f"saved plot: {path}", err=as_json)
    labels = {
        "noise_multiplier": f"smallest sigma meeting epsilon <= {target_epsilon:g} under the "
        f"{accountant} accountant (to 1e-4 relative, rounded up)",
        "noise_per_example": "sigma / B: noise in the averaged clipped gradient, in units of C",
        "heuristic": "last-iterate heuristic (final model only; not a proven bound for deep "
        "networks)",
        "robust_heuristic": "max over the last t <= T steps of the heuristic",
        "standard": "standard composition (all iterates released): dp_accounting PLD, upper "
        "bound",
        "full_batch": "full-batch DP-GD with the same expected step and noise",
    }
    if as_json:
        emit_json({
            "dataset_size": dataset_size, "target_epsilon": target_epsilon, "delta": delta,
            "epochs": epochs, "steps": steps, "accountant": accountant,
            "standard_discretization": discretization, "rows": rows, "labels": labels,
        })
        return
    from opacus_lastiterate.figures import Column, FigureResult

    span = f"{epochs:g} epochs" if epochs is not None else f"T = {steps} steps"
    table = FigureResult(
        name="plan",
        title=f"N = {dataset_size}, {span}, {accountant} epsilon = {target_epsilon:g} at "
        f"delta = {delta:g}",
        settings={},
        columns=[Column(*c) for c in _COLUMNS],
        rows=rows,
        labels=labels,
    )
    click.echo(table.table())
