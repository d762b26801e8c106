"""Where the frozen-second-moment heuristic for adaptive optimisers has been checked.

``scripts/adam_study.py`` simulates DP-Adam's exact one-dimensional mechanism (linear loss,
the canary's coordinate, Adam's real random second moment) and compares the final model's
simulated epsilon with the heuristic of
:mod:`opacus_lastiterate.analysis.last_iterate.adaptive_weights` (``docs/adaptive_optimizers.md``,
"The study"). In every simulated setting the valid 95% lower bound stayed at or below the
heuristic, and the simulated estimate stayed within its Monte Carlo error of (or below) the
same estimator applied to the frozen model: no setting was found where the heuristic
understates. Outside the simulated box nothing is known, so an accountant should say so.

:func:`adaptive_heuristic_caveats` returns one sentence per way a run leaves the box (empty
inside it); an accountant warns with them. :data:`STUDIED_RANGES` is the box: it spans the
simulated points, not all of whose corners were simulated (a rule of thumb from the table).
"""

from __future__ import annotations

import math

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import canonical_adaptive_name

__all__ = [
    "adaptive_heuristic_caveats",
]

#: Optimisers whose real mechanism the study simulated (AdamW's decoupled decay does not
#: touch the gradient, so its second moment is Adam's).
SIMULATED_OPTIMIZERS: tuple[str, ...] = ("adam", "adamw")

#: Closed ranges of the simulated settings (``docs/results/adam_study.csv``). ``eps_over_noise``
#: is Adam's eps divided by the noise std sigma C / B of a coordinate of the averaged gradient.
STUDIED_RANGES: dict[str, tuple[float, float]] = {
    "sample_rate": (1e-3, 0.3),
    "noise_multiplier": (0.3, 4.0),
    "beta1": (0.0, 0.9),
    "beta2": (0.0, 0.999),
    "eps_over_noise": (0.0, 3.0),
    "steps": (200, 10_000),
}


def adaptive_heuristic_caveats(
    optimizer: object,
    *,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    beta1: float,
    beta2: float,
    eps_over_noise: float,
) -> tuple[str, ...]:
    """Sentences saying how a run lies outside the settings where the adaptive heuristic was
    checked against simulation; ``()`` inside them.

    Args:
        optimizer: the optimiser (name, class or instance; see
            :func:`~.adaptive_weights.canonical_adaptive_name`).
        sample_rate: q (the largest of the run if it changes).
        noise_multiplier: sigma (the smallest of the run if it changes).
        steps: T.
        beta1, beta2: Adam's betas (the extreme values of the run if they change).
        eps_over_noise: Adam's eps / (sigma C / B) (the largest of the run).

    Raises:
        UnsupportedOptimizerError: ``optimizer`` has no adaptive weights.
        TypeError, ValueError: a value of the wrong type or out of its domain (named).
    """
    name = canonical_adaptive_name(optimizer)
    values = {
        "sample_rate": check_in_interval("sample_rate", sample_rate, 0.0, 1.0, high_open=False),
        "noise_multiplier": check_in_interval("noise_multiplier", noise_multiplier, 0.0, math.inf),
        "beta1": check_in_interval("beta1", beta1, 0.0, math.inf, low_open=False),
        "beta2": check_in_interval("beta2", beta2, 0.0, 1.0, low_open=False),
        "eps_over_noise": check_in_interval(
            "eps_over_noise", eps_over_noise, 0.0, math.inf, low_open=False
        ),
        "steps": float(check_int("steps", steps, minimum=1)),
    }
    out: list[str] = []
    if name not in SIMULATED_OPTIMIZERS:
        out.append(
            f"{name}: its weights follow the same frozen-second-moment model, but only Adam "
            "and AdamW were simulated (docs/adaptive_optimizers.md)."
        )
    for key, (low, high) in STUDIED_RANGES.items():
        value = values[key]
        if not low <= value <= high:
            out.append(
                f"{key} = {value:g} is outside the simulated range [{low:g}, {high:g}]: "
                "the adaptive heuristic is unchecked there."
            )
    return tuple(out)
