"""Renyi-DP of DP-SGD at Opacus's orders, and the two RDP -> (epsilon, delta) conversions
that Opacus releases have used (``docs/opacus_versions.md``).

The RDP of the Poisson-subsampled Gaussian mechanism comes from dp_accounting's
``RdpAccountant`` (public ``orders``/``rdp``), the same analysis as Opacus's (Mironov, Talwar,
Zhang, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", arXiv 1908.10530).
For RDP eps_a at order a over the whole run:

* classic (Opacus 0.9.0-0.13.0): epsilon = min_a eps_a - log(delta) / (a - 1);
* improved (Opacus 0.14.0-1.6.0; Balle, Barthe, Gaboardi, Hsu, Sato, "Hypothesis Testing
  Interpretations and Renyi Differential Privacy", arXiv 1905.09982):
  epsilon = min_a eps_a - (log(delta) + log(a)) / (a - 1) + log((a - 1) / a).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "subsampled_gaussian_rdp",
]

OPACUS_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""Opacus's default RDP orders (0.12.0 privacy_engine.py:18; 1.6.0 accountants/rdp.py:22);
0.9-0.11 had no default and their examples pass the same list (0.9.0 examples/mnist.py:234)."""


def subsampled_gaussian_rdp(
    sample_rate: float, noise_multiplier: float, steps: int, orders: Sequence[float]
) -> np.ndarray:
    """RDP at ``orders`` of ``steps`` Poisson-subsampled Gaussian steps (validated inputs)."""
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(orders=list(orders))
    event = dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier))
    accountant.compose(event, steps)
    return np.asarray(accountant.rdp, dtype=float)


def _best(eps: np.ndarray, orders: np.ndarray) -> tuple[float, float]:
    """(min epsilon, its order); inf when no order gives a number."""
    if np.all(np.isnan(eps)):
        return math.inf, math.nan
    i = int(np.nanargmin(eps))
    return float(eps[i]), float(orders[i])


def classic_conversion(
    orders: Sequence[float], rdp: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """epsilon = min_a rdp_a - log(delta) / (a - 1) (Opacus 0.9.0 privacy_analysis.py:349)."""
    a, r = np.asarray(orders, dtype=float), np.asarray(rdp, dtype=float)
    return _best(r - math.log(delta) / (a - 1.0), a)


def improved_conversion(
    orders: Sequence[float], rdp: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """epsilon = min_a rdp_a - (log delta + log a) / (a - 1) + log((a - 1) / a) (Opacus
    0.14.0 privacy_analysis.py:300-303; 1.6.0 accountants/analysis/rdp.py:319-323)."""
    a, r = np.asarray(orders, dtype=float), np.asarray(rdp, dtype=float)
    return _best(r - (math.log(delta) + np.log(a)) / (a - 1.0) + np.log((a - 1.0) / a), a)
