"""``opacus-lastiterate audit``: privacy audits from the final model only (``docs/cli.md``,
"audit"; background in ``docs/auditing.md``).

* ``audit records FILE``: re-audit a run-records file written by
  :class:`~opacus_lastiterate.auditing.AuditRunner` with another threshold strategy,
  confidence, delta or method, training nothing;
* ``audit digits``: train R small Opacus models on scikit-learn's digits with and without a
  canary (:class:`~opacus_lastiterate.auditing.OpacusDigitsTrainer`) and audit them.

The audit's epsilon is a statistically valid LOWER bound (Clopper-Pearson) unless the
method says estimate; it is printed beside the heuristic and the standard (upper) bound.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from opacus_lastiterate.cli._options import (
    COUNT,
    POSITIVE,
    PROBABILITY,
    Interval,
    OutputPath,
    emit_json,
    json_option,
    plot_option,
    writing,
)
from opacus_lastiterate.figures._plotting import QUICK_NOTE

__all__ = ["audit"]

THRESHOLDS = ("rank-grid", "bonferroni", "held-out", "multi-split", "naive-max")
METHODS = ("clopper-pearson", "gaussian-dp")
_BOUND_LABEL = "audit: LOWER bound (Clopper-Pearson, statistically valid)"
_ESTIMATE_LABEL = "audit: estimate (assumes a Gaussian trade-off; not a bound)"


def _strategy(name: str, seed: int) -> Any:
    from opacus_lastiterate.analysis.audit import (
        Bonferroni,
        HeldOutSplit,
        MultiSplit,
        NaiveMax,
        RankGridBonferroni,
    )

    return {
        "rank-grid": lambda: RankGridBonferroni(),
        "bonferroni": lambda: Bonferroni(),
        "held-out": lambda: HeldOutSplit(seed=seed),
        "multi-split": lambda: MultiSplit(seed=seed),
        "naive-max": lambda: NaiveMax(),
    }[name]()




def _plot_scores(records: Any, result: Any, path: Path, title: str, note: str = "") -> None:
    from opacus_lastiterate.figures._plotting import OKABE_ITO, pyplot, quick_note, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ins, outs = records.in_scores, records.out_scores
    ax.hist(outs, bins=30, alpha=0.6, color=OKABE_ITO[5], hatch="//",
            label=f"without the canary ({outs.size} runs)")
    ax.hist(ins, bins=30, alpha=0.6, color=OKABE_ITO[1], label=f"with the canary ({ins.size} runs)")
    if result.threshold is not None and abs(result.threshold) != float("inf"):
        ax.axvline(result.threshold, color="k", ls="--", label="selected threshold")
    ax.set_xlabel("score of the canary (no unit; higher = the canary was in)")
    ax.set_ylabel("number of runs")
    ax.set_title(title)
    quick_note(fig, {"size": "quick" if note else "default"})  # above the axes
    # below the axes: the legend covers no bar
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3,
              frameon=False)
    save(fig, path)


def _audit_options(f: Any) -> Any:
    for option in reversed([
        click.option("--delta", type=PROBABILITY, default=1e-5, show_default=True,
                     help="Delta of the audit, in (0, 1)."),
        click.option("--confidence", type=Interval(0.0, 1.0), default=0.95, show_default=True,
                     help="Confidence of the lower bound, in (0, 1)."),
        click.option("--threshold", type=click.Choice(THRESHOLDS), default="rank-grid",
                     show_default=True,
                     help="How the threshold is chosen: rank-grid (Bonferroni over a rank "
                     "grid), bonferroni (every score), held-out (split), multi-split, or "
                     "naive-max (NOT statistically valid, for comparison only)."),
        click.option("--method", type=click.Choice(METHODS), default="clopper-pearson",
                     show_default=True,
                     help="clopper-pearson (a lower bound) or gaussian-dp (an estimate)."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Seed of the split strategies (and of the runs for 'digits')."),
    ]):
        f = option(f)
    return f


@click.group(short_help="Audit from the final model: an epsilon lower bound.")
def audit() -> None:
    """Audit DP-SGD from the final model: a statistically valid epsilon lower bound."""


@audit.command("records", short_help="Re-audit a run-records file (no training).")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                metavar="FILE")
@_audit_options
@click.option("--num-runs", type=click.IntRange(min=2), default=None,
              help="Audit only the first N runs of the file [default: all].")
@json_option
@plot_option("the score histograms with the selected threshold", "audit_scores.png")
def records_command(
    path: Path, delta: float, confidence: float, threshold: str, method: str, seed: int,
    num_runs: int | None, as_json: bool, plot: Path | None,
) -> None:
    """Re-audit a run-records FILE (JSON lines of AuditRunner), training nothing."""
    from opacus_lastiterate.auditing.runner import audit_records, read_records

    records = read_records(path)
    if num_runs is not None:
        records = records.first(num_runs)
    result = audit_records(
        records, delta=delta, confidence=confidence,
        threshold_strategy=_strategy(threshold, seed), method=method,  # type: ignore[arg-type]
    )
    if plot is not None:
        target = plot
        with writing(target, "--plot"):
            _plot_scores(records, result, target, f"{path.name}: {len(records.records)} runs")
        click.echo(f"saved plot: {target}", err=as_json)
    n_in, n_out = len(records.in_scores), len(records.out_scores)
    if as_json:
        emit_json({"records": str(path), "runs": n_in + n_out, "runs_with_canary": n_in,
                   "runs_without_canary": n_out, "audit": result.as_dict()})
        return
    click.echo(f"{path}: {n_in + n_out} runs, {n_in} with the canary, {n_out} without")
    click.echo(f"  {result}")


@audit.command("digits", short_help="Train R digits models with/without a canary; audit.")
@click.option("--quick", is_flag=True,
              help="A small configuration for a first try: 24 runs of 10 steps, one process.")
@click.option("--runs", type=click.IntRange(min=2), default=200, show_default=True,
              help="R, models trained (half with the canary, by seeded fair coins).")
@click.option("--steps", type=COUNT, default=50, show_default=True,
              help="T, DP-SGD steps per model.")
@click.option("--noise-multiplier", type=POSITIVE, default=0.5, show_default=True,
              help="Noise multiplier sigma.")
@click.option("--batch-size", type=COUNT, default=64, show_default=True,
              help="Expected batch size B.")
@click.option("--num-examples", type=COUNT, default=400, show_default=True,
              help="N, training examples (a subset of the 1797 digits).")
@click.option("--learning-rate", type=POSITIVE, default=0.5, show_default=True,
              help="SGD learning rate.")
@click.option("--max-grad-norm", type=POSITIVE, default=1.0, show_default=True,
              help="Clipping norm C.")
@click.option("--hidden", type=click.IntRange(min=0), default=0, show_default=True,
              help="Hidden units (0: softmax regression).")
@click.option("--canary", type=click.Choice(["gradient", "input"]), default="gradient",
              show_default=True,
              help="gradient: a Dirac gradient canary on a pixel no image uses (targets the "
              "heuristic); input: a mislabelled digit.")
@_audit_options
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Worker processes (0: in this process) [default: one per CPU; 0 with "
              "--quick].")
@click.option("--records", "records_path", type=OutputPath(),
              default=None, metavar="FILE",
              help="Keep the runs in FILE (JSON lines): a rerun resumes, 'audit records' "
              "re-audits.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show a progress bar (needs tqdm).")
@json_option
@plot_option("the score histograms with the selected threshold", "audit_scores.png")
def digits_command(
    quick: bool, runs: int, steps: int, noise_multiplier: float, batch_size: int,
    num_examples: int, learning_rate: float, max_grad_norm: float, hidden: int, canary: str,
    delta: float, confidence: float, threshold: str, method: str, seed: int,
    workers: int | None, records_path: Path | None, progress: bool, as_json: bool,
    plot: Path | None,
) -> None:
    """Train R small Opacus models on digits (with/without a canary) and audit them."""
    from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer
    from opacus_lastiterate.auditing.runner import AuditRunner, audit_records

    if quick:
        runs, steps, workers = 24, 10, 0 if workers is None else workers
    trainer = OpacusDigitsTrainer(
        canary=canary,  # type: ignore[arg-type]
        steps=steps, batch_size=batch_size, num_examples=num_examples,
        noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
        learning_rate=learning_rate, hidden=hidden,
    )
    runner = AuditRunner(
        trainer, trainer.score, num_runs=runs, seed=seed, path=records_path,
        workers=(os.cpu_count() or 1) if workers is None else workers,
        progress=progress and not as_json,
    )
    if records_path is None:
        records = runner.run()
    else:
        with writing(records_path, "--records"):
            records = runner.run()
    result = audit_records(
        records, delta=delta, confidence=confidence,
        threshold_strategy=_strategy(threshold, seed), method=method,  # type: ignore[arg-type]
    )
    heuristic, standard = trainer.heuristic_epsilon(delta), trainer.standard_epsilon(delta)
    if plot is not None:
        target = plot
        with writing(target, "--plot"):
            _plot_scores(records, result, target, f"digits, {canary} canary, {runs} runs",
                         note=QUICK_NOTE if quick else "")
        click.echo(f"saved plot: {target}", err=as_json)
    configuration = {
        "runs": runs, "steps": steps, "sample_rate": trainer.sample_rate,
        "noise_multiplier": noise_multiplier, "batch_size": batch_size,
        "num_examples": num_examples, "learning_rate": learning_rate,
        "max_grad_norm": max_grad_norm, "hidden": hidden, "canary": canary, "seed": seed,
    }
    labels = {
        "audit": _BOUND_LABEL if result.kind == "bound" else _ESTIMATE_LABEL,
        "heuristic": "last-iterate heuristic (final model only; not a DP guarantee)",
        "standard": "standard composition (all iterates released): an UPPER bound",
    }
    if as_json:
        emit_json({"configuration": configuration, "audit": result.as_dict(),
                   "heuristic": heuristic, "standard": standard, "labels": labels,
                   "records": None if records_path is None else str(records_path),
                   "trained": runner.last_trained})
        return
    click.echo(
        f"Audit of DP-SGD on digits: {runs} runs ({runner.last_trained} trained now), "
        f"{canary} canary, T = {steps}, q = {trainer.sample_rate:.4g}, "
        f"sigma = {noise_multiplier:g}, C = {max_grad_norm:g}, delta = {delta:g}"
    )
    sign = ">=" if result.kind == "bound" else "~ "
    click.echo(f"  {labels['audit']:<62} {sign} {result.epsilon:.3f}")
    click.echo(f"  {labels['heuristic']:<62} =  {heuristic:.3f}")
    click.echo(f"  {labels['standard']:<62} <= {standard:.3f}")
    click.echo(f"  {result}")
    if quick:
        click.echo(f"  {QUICK_NOTE}: {runs} runs of {steps} steps can only give a lower bound "
                   "near 0, which says nothing about the model; run without --quick "
                   "(200 runs) or with more --runs for an informative audit")
    if records_path is not None:
        click.echo(f"  runs kept in {records_path} (rerun to resume; "
                   f"'opacus-lastiterate audit records {records_path}' to re-audit)")
