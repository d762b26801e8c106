"""Normalised DP-SGD: the divisor of (sum + Z) / c leaks (``docs/normalisation.md``).

numpy / scipy / dp_accounting only. Each number names its model:

* :mod:`opacus_arithmetic`: Opacus 1.x's exact (sample rate, divisor) from (N, batch size).
* :mod:`divisor_verdict`: FEASGM / EASGM verdict over the neighbours N - 1, N, N + 1
  (safe: the SGM guarantee holds exactly; unsafe: epsilon = inf), and the public-divisor fix.
* :mod:`divisor_leak`: the exact dimension-aware curve of (sum + Z) / c in the
  zero-other-gradients configuration (what audits reach; SGM's curve when c is constant).
* :mod:`asgm`: ASGM, "batch size revealed" model (division by the realised batch size).
* :mod:`discretisation`: pessimistic discretisation of a one-step PLD from exact tails.
* :mod:`simulation`, :mod:`empirical`: Monte Carlo of each mechanism and the
  likelihood-ratio audit used to validate the curves.
"""

from opacus_lastiterate.analysis.normalisation.asgm import (
    asgm_delta,
    asgm_epsilon,
    asgm_pld,
)
from opacus_lastiterate.analysis.normalisation.divisor_leak import (
    divisor_leak_pld,
    feasgm_delta,
    feasgm_epsilon,
)
from opacus_lastiterate.analysis.normalisation.divisor_verdict import (
    DivisorVerdict,
    unsafe_dataset_sizes,
)
from opacus_lastiterate.analysis.normalisation.empirical import importance_delta, threshold_delta
from opacus_lastiterate.analysis.normalisation.simulation import (
    simulate_asgm,
    simulate_divisor_leak,
)

__all__ = [
    "DivisorVerdict",
    "asgm_delta",
    "asgm_epsilon",
    "asgm_pld",
    "divisor_leak_pld",
    "feasgm_delta",
    "feasgm_epsilon",
    "importance_delta",
    "simulate_asgm",
    "simulate_divisor_leak",
    "threshold_delta",
    "unsafe_dataset_sizes",
]
