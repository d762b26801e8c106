"""``opacus-lastiterate compare-versions``: one row per Opacus release 0.9.0-1.6.0
(``docs/opacus_versions.md``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from opacus_lastiterate.cli._options import (
    COUNT,
    POSITIVE,
    PROBABILITY,
    emit_json,
    fmt_eps,
    json_option,
    plot_option,
    writing,
)

__all__ = ["compare_versions"]


def _release_spans(versions: list[str]) -> str:
    """``versions`` (in release order) as text: a run of three or more consecutive releases
    as "first-last" (consecutive among all known releases, so that a range never covers a
    release the list leaves out), the others one by one: "0.9.0-0.11.0, 0.14.0"."""
    from opacus_lastiterate.analysis.opacus_versions import OPACUS_RELEASES

    index = {rel.version: i for i, rel in enumerate(OPACUS_RELEASES)}
    runs: list[list[str]] = []
    for version in versions:
        if runs and version in index and runs[-1][-1] in index \
                and index[version] == index[runs[-1][-1]] + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    parts = [f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(run) for run in runs]
    return ", ".join(parts)


@click.command("compare-versions", short_help="Reported vs corrected epsilon per Opacus release.")
@click.option("--dataset-size", type=COUNT, required=True, help="N = len(dataset).")
@click.option("--batch-size", type=COUNT, required=True, help="DataLoader batch size L.")
@click.option("--noise-multiplier", type=POSITIVE, required=True,
              help="Noise multiplier sigma > 0.")
@click.option("--delta", type=PROBABILITY, required=True, help="Target delta in (0, 1).")
@click.option("--epochs", type=COUNT, default=None, help="Epochs [default: 1].")
@click.option("--steps", type=COUNT, default=None,
              help="A fixed number of steps instead of --epochs.")
@click.option("--dimension", type=COUNT, default=None,
              help="Trainable parameters d: adds the FEASGM curve epsilon (1.x).")
@click.option("--loss-reduction", type=click.Choice(["mean", "sum"]), default="mean",
              show_default=True, help="The loss reduction passed to make_private.")
@click.option("--no-poisson", is_flag=True,
              help="Fixed-size shuffled batches (1.x poisson_sampling=False).")
@click.option("--drop-last", is_flag=True, help="The DataLoader has drop_last=True.")
@click.option("--versions", default=None, metavar="SPEC",
              help="Range A..B (inclusive), list A,B or one version [default: all 26].")
@json_option
@plot_option("reported, corrected and heuristic epsilon per release", "opacus_versions.png")
def compare_versions(
    dataset_size: int, batch_size: int, noise_multiplier: float, delta: float,
    epochs: int | None, steps: int | None, dimension: int | None, loss_reduction: str,
    no_poisson: bool, drop_last: bool, versions: str | None, as_json: bool, plot: Path | None,
) -> None:
    """One row per Opacus release (0.9.0-1.6.0): reported vs corrected epsilon, warnings.

    For one training configuration, what each Opacus release runs (mechanism, divisor), what
    it reports with its own default accountant, the corrected epsilon, the last-iterate
    heuristic and warnings.
    """
    from opacus_lastiterate.analysis.opacus_releases import installed_version
    from opacus_lastiterate.analysis.opacus_versions import ACCOUNTANT_LABELS, VersionConfig
    from opacus_lastiterate.analysis.opacus_versions import compare_versions as compare

    if epochs is not None and steps is not None:
        raise click.UsageError("Pass at most one of --epochs and --steps.")
    config = VersionConfig(
        dataset_size=dataset_size,
        batch_size=batch_size,
        noise_multiplier=noise_multiplier,
        delta=delta,
        epochs=None if steps is not None else (epochs or 1),
        steps=steps,
        dimension=dimension,
        poisson=not no_poisson,
        loss_reduction=loss_reduction,  # type: ignore[arg-type]
        drop_last=drop_last,
    )
    rows = compare(config, versions)
    if plot is not None:
        path = plot
        with writing(path, "--plot"):
            _plot_versions(rows, delta, path)
        click.echo(f"saved plot: {path}", err=as_json)
    if as_json:
        emit_json({
            "configuration": {k: getattr(config, k) for k in config.__dataclass_fields__},
            "installed": installed_version(),
            "accountants": ACCOUNTANT_LABELS,
            "rows": [r.as_dict() for r in rows],
        })
        return
    span = f"{config.steps} steps" if config.steps is not None else f"{config.epochs} epoch(s)"
    click.echo(
        f"N = {config.dataset_size}, L = {config.batch_size}, sigma = {config.noise_multiplier:g}, "
        f"{span}, delta = {config.delta:g}, {'Poisson' if config.poisson else 'shuffled'}, "
        f"loss_reduction = {config.loss_reduction}; installed opacus: {installed_version()}"
    )
    curve = any(r.curve is not None for r in rows)
    notes = list(dict.fromkeys(w for r in rows for w in r.warnings))  # first-seen order
    number = {note: i for i, note in enumerate(notes, 1)}
    click.echo(f"{'version':<8} {'mechanism':<17} {'accountant':<13} {'q':>10} {'steps':>6} "
               f"{'divisor':<26} {'reported':>9} {'corrected':>10} {'heuristic':>9}"
               + (f" {'curve':>9}" if curve else "") + (" notes" if notes else ""))
    for r in rows:
        line = (f"{r.version:<8} {r.mechanism:<17} {r.accountant:<13} {r.sample_rate:>10.6g} "
                f"{r.steps:>6} {r.divisor:<26} {fmt_eps(r.reported)[1:]} {fmt_eps(r.corrected)} "
                f"{fmt_eps(r.heuristic)[1:]}")
        if curve:
            line += " " + (fmt_eps(r.curve)[1:] if r.curve is not None else f"{'-':>9}")
        if r.warnings:
            line += " " + ",".join(str(number[w]) for w in r.warnings)
        click.echo(line)
    if notes:
        click.echo("notes (the releases each applies to):")
        for note in notes:
            where = _release_spans([r.version for r in rows if note in r.warnings])
            click.echo(f"  {number[note]}. {where}: {note}")
    click.echo("corrected models:")
    for model in dict.fromkeys(r.corrected_model for r in rows):
        click.echo(f"  - {model}")
    click.echo("accountants: " + "; ".join(f"{k}: {v}" for k, v in ACCOUNTANT_LABELS.items()))
    click.echo("heuristic: last-iterate heuristic at the accountant's q (final model only; "
               "SGM assumed)")


def _plot_versions(rows: list[Any], delta: float, path: Path) -> None:
    from opacus_lastiterate.figures._plotting import legend_below, pyplot, save, series_style

    plt = pyplot()
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(10, 4))
    labels = {"reported": "reported by the release", "corrected": "corrected epsilon",
              "heuristic": "last-iterate heuristic"}
    for i, (key, line) in enumerate((("reported", "-"), ("corrected", "--"),
                                     ("heuristic", ":"))):
        ys = [getattr(r, key) for r in rows]
        ax.plot(xs, [y if math.isfinite(y) else float("nan") for y in ys], line,
                label=labels[key], **series_style(i + (i > 0)))
        for x, y in zip(xs, ys):
            if not math.isfinite(y):
                ax.annotate("inf", (x, 0), textcoords="offset points", xytext=(0, 5), ha="center")
    ax.set_xticks(xs, [r.version for r in rows], rotation=60)
    ax.set_xlabel("Opacus release")
    ax.set_ylabel(f"epsilon at delta = {delta:g} (no unit)")
    ax.set_title("What each Opacus release reports, and the corrected epsilon")
    ax.grid(True, alpha=0.3)
    legend_below(fig, ax, ncol=3)
    save(fig, path)
