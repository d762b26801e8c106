"""``opacus-lastiterate normalisation``: is Opacus 1.x's printed epsilon valid for this data
set size? (``docs/normalisation.md``, "FEASGM / EASGM with a data-dependent divisor")."""

from __future__ import annotations

import math
from typing import Any

import click

from opacus_lastiterate.cli._options import (
    COUNT,
    POSITIVE,
    PROBABILITY,
    check_batch_size,
    emit_json,
    fmt_eps,
    json_option,
)

__all__ = ["normalisation", "normalisation_report"]


def normalisation_report(
    dataset_size: int,
    batch_size: int,
    noise_multiplier: float,
    epochs: int,
    delta: float,
    dimension: int | None = None,
    drop_last: bool = False,
) -> dict[str, Any]:
    """All numbers of the ``normalisation`` command, each with its model label."""
    from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
    from opacus_lastiterate.analysis.normalisation import asgm_epsilon
    from opacus_lastiterate.analysis.normalisation.asgm import ASGM_MODEL
    from opacus_lastiterate.analysis.normalisation.divisor_leak import FEASGM_MODEL, feasgm_epsilon
    from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict
    from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
        opacus1x_batch_arithmetic,
    )

    n, b, sigma, dim = dataset_size, batch_size, noise_multiplier, dimension
    check_batch_size(b, n, drop_last=drop_last)
    row = opacus1x_batch_arithmetic(n, b, drop_last=drop_last)
    steps = epochs * row.steps_per_epoch  # len(DPDataLoader) batches per epoch
    verdict = feasgm_verdict(n, b, drop_last=drop_last)
    sgm = standard_epsilon(delta, steps=steps, sample_rate=row.accountant_rate,
                           noise_multiplier=sigma)
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
            delta, dataset_size=n, batch_size=b, noise_multiplier=sigma, steps=steps,
            dimension=dim, drop_last=drop_last,
        )
        curve = {"epsilon": value, "model": FEASGM_MODEL.format(dimension=dim)}
    asgm = asgm_epsilon(
        delta, dataset_size=n, sample_rate=row.sampler_rate, noise_multiplier=sigma, steps=steps
    )
    return {
        "configuration": {
            "dataset_size": n, "batch_size": b, "noise_multiplier": sigma, "epochs": epochs,
            "delta": delta, "dimension": dim, "drop_last": bool(drop_last),
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
            "sample_rate": row.sampler_rate,
            "model": f"{ASGM_MODEL}, Opacus 0.x divisor |B|, q = 1/{row.loader_length}",
        },
    }


@click.command(short_help="Does Opacus 1.x's epsilon hold for this data set size?")
@click.option("--dataset-size", type=click.IntRange(min=2), required=True,
              help="N = len(dataset), at least 2.")
@click.option("--batch-size", type=COUNT, required=True, help="DataLoader batch size L.")
@click.option("--noise-multiplier", type=POSITIVE, required=True,
              help="Noise multiplier sigma > 0.")
@click.option("--epochs", type=COUNT, required=True, help="Number of epochs E >= 1.")
@click.option("--delta", type=PROBABILITY, required=True, help="Target delta in (0, 1).")
@click.option("--dimension", type=COUNT, default=None,
              help="Number of trainable parameters d: adds the dimension-aware FEASGM curve "
              "epsilon.")
@click.option("--drop-last", is_flag=True, help="The DataLoader has drop_last=True.")
@json_option
def normalisation(
    dataset_size: int, batch_size: int, noise_multiplier: float, epochs: int, delta: float,
    dimension: int | None, drop_last: bool, as_json: bool,
) -> None:
    """Opacus 1.x divisor verdict: SGM, FEASGM (corrected, curve) and ASGM epsilons.

    Opacus 1.x make_private(poisson_sampling=True) divides the noisy gradient sum by
    int(N / len(DPDataLoader)), a function of the private N. Prints the SGM epsilon Opacus
    accounts, the FEASGM verdict over N - 1, N, N + 1, the corrected epsilon and the ASGM
    (Opacus 0.x, divide by |B|) epsilon.
    """
    report = normalisation_report(
        dataset_size, batch_size, noise_multiplier, epochs, delta, dimension, drop_last
    )
    if as_json:
        emit_json(report)
        return
    c, v = report["configuration"], report["feasgm_verdict"]
    click.echo(
        f"Opacus 1.x make_private(poisson_sampling=True): N = {c['dataset_size']}, "
        f"L = {c['batch_size']}, sigma = {c['noise_multiplier']:g}, {c['epochs']} epoch(s) x "
        f"{report['steps_per_epoch']} steps = {report['steps']} steps, delta = {c['delta']:g}"
    )
    click.echo(f"  SGM epsilon        {fmt_eps(report['sgm']['epsilon'])}   "
               f"[{report['sgm']['model']}]")
    click.echo(f"  FEASGM verdict     {v['verdict']:>10}   [{v['model']}]")
    click.echo(f"      {'N':>12} {'divisor':>10} {'sample rate':>14} {'steps/epoch':>12}")
    for i, size in enumerate(v["dataset_sizes"]):
        click.echo(
            f"      {size:>12} {v['divisors'][i]:>10g} {v['sample_rates'][i]:>14.8g} "
            f"{v['steps_per_epoch'][i]:>12}"
        )
    click.echo(f"      reason: {v['reason']}")
    corr = report["corrected"]
    click.echo(f"  corrected epsilon  {fmt_eps(corr['epsilon'])}   [{corr['model']}]")
    if report["curve"] is not None:
        click.echo(f"  curve epsilon      {fmt_eps(report['curve']['epsilon'])}   "
                   f"[{report['curve']['model']}]")
    asgm = report["asgm"]
    click.echo(f"  ASGM epsilon       {fmt_eps(asgm['epsilon'])}   [{asgm['model']}]")
