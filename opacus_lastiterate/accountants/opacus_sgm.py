"""The SGM (Poisson-subsampled Gaussian, sum released) epsilon and delta as Opacus's own
accountants give them: what :class:`~opacus_lastiterate.accountants.FEASGMAccountant` reports
when its ``standard`` setting is ``"rdp"`` or ``"prv"``, so that its value is the one Opacus
itself prints for the same history.
"""

from __future__ import annotations

import math

from opacus_lastiterate.accountants.base import History

__all__ = []


def opacus_sgm_epsilon(history: History, delta: float, standard: str) -> float:
    """The SGM epsilon from Opacus's own ``"rdp"`` or ``"prv"`` accountant, as Opacus gives
    it (which can be negative at a large delta, and for ``"prv"`` a ``RuntimeError`` for a
    delta near 1)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    cls = {"rdp": RDPAccountant, "prv": PRVAccountant}[standard]
    acc = cls()
    acc.history = list(history)
    return float(acc.get_epsilon(delta))


def opacus_rdp_delta(history: History, epsilon: float) -> float:
    """The SGM delta(epsilon) that inverts Opacus's ``RDPAccountant.get_epsilon``.

    Opacus converts the RDP curve at its ``DEFAULT_ALPHAS`` with Balle et al. (AISTATS 2020,
    Theorem 21), ``eps(delta) = min_a [rdp_a - (log delta + log a) / (a - 1)
    + log((a - 1) / a)]`` (every Opacus 1.x release). Solved for delta at each order,
    ``log delta_a(eps) = (a - 1) (rdp_a + log((a - 1) / a) - eps) - log a``, and
    ``delta(eps) = min(1, min_a delta_a(eps))``: the same theorem read the other way, so
    that ``get_epsilon(get_delta(e)) == e`` and ``get_delta(get_epsilon(d)) == d`` up to
    floating point (where the epsilon is >= 0 and the delta < 1).
    """
    import numpy as np
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = sum(  # exactly what RDPAccountant.get_privacy_spent sums
        [
            rdp_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
            for sigma, q, steps in history
        ]
    )
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        log_delta = (a - 1) * (r + np.log((a - 1) / a) - epsilon) - np.log(a)
    finite = log_delta[~np.isnan(log_delta)]
    if not finite.size:
        return 1.0
    return float(min(1.0, math.exp(min(0.0, float(finite.min())))))
