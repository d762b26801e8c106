"""``opacus-lastiterate counterexample``: the quadratic-regulariser example beside the
heuristic (``docs/last_iterate.md``, "Known counterexamples")."""

from __future__ import annotations

from typing import Any

import click

from opacus_lastiterate.cli._options import UNIT, dp_sgd_options, emit_json, json_option

__all__ = ["counterexample"]

_METHOD_LABELS = {
    "exact": "exact",
    "linear": "exact (the linear case)",
    "one-step": "exact (one step)",
    "paper": "upper bound, the paper's rounding",
    "grid": "upper bound within 0.1%",
}


@click.command(short_help="Quadratic-regulariser counterexample vs the heuristic.")
@dp_sgd_options()
@click.option("--alpha", type=UNIT, default=0.5, show_default=True,
              help="Regulariser coefficient alpha in [0, 1].")
@json_option
def counterexample(
    steps: int, sample_rate: float, noise_multiplier: float, delta: float, alpha: float,
    as_json: bool,
) -> None:
    """Linear loss + quadratic regulariser against the heuristic.

    The final model of DP-SGD on a linear loss with regulariser alpha m^2 / 2 (learning rate
    1, one dimension) compared with the heuristic eps_T, one step eps_1 (a zeroing
    regulariser) and the robust max over t <= T of eps_t.
    """
    from opacus_lastiterate.analysis.last_iterate.counterexamples import (
        quadratic_regulariser_comparison,
    )

    c = quadratic_regulariser_comparison(
        delta, steps=steps, sample_rate=sample_rate, noise_multiplier=noise_multiplier,
        alpha=alpha,
    )
    method = _METHOD_LABELS.get(c.quadratic.method, c.quadratic.method)
    rows = {
        "quadratic": (c.quadratic.epsilon,
                      f"linear loss + {alpha:g} m^2 / 2 regulariser ({method})"),
        "quadratic_lower": (c.quadratic.epsilon_lower, "lower bound of the same"),
        "heuristic": (c.epsilon_linear, "last-iterate heuristic eps_T (alpha = 0)"),
        "one_step": (c.epsilon_one_step, "one step eps_1 (alpha = 1, zeroing regulariser)"),
        "robust_heuristic": (max(c.epsilon_robust, c.epsilon_linear),
                             f"max over t <= T of eps_t (at t = {c.robust_steps})"),
    }
    if as_json:
        payload: dict[str, Any] = {k: v for k, (v, _) in rows.items()}
        payload.update(
            steps=steps, sample_rate=sample_rate, noise_multiplier=noise_multiplier,
            delta=delta, alpha=alpha, method=c.quadratic.method,
            ratio_to_robust=c.ratio_to_robust, exceeds_heuristic=c.exceeds_heuristic,
            labels={k: lab for k, (_, lab) in rows.items()},
        )
        emit_json(payload)
        return
    click.echo(
        f"Quadratic-regulariser counterexample, T = {steps}, q = {sample_rate:g}, "
        f"sigma = {noise_multiplier:g}, delta = {delta:g}"
    )
    for key, (value, label) in rows.items():
        click.echo(f"  {key:<17} eps = {value:10.4f}   {label}")
    verdict = "exceeds" if c.exceeds_heuristic else "does not exceed"
    click.echo(f"  the quadratic example {verdict} the heuristic; ratio to the robust value "
               f"{c.ratio_to_robust:.4f}")
