"""Opacus's own RDP arithmetic (every release 0.9.0-1.6.0), reproduced in numpy/scipy.

``compute_rdp`` and its helpers are Opacus's code (Apache-2.0; derived from TF Privacy's
rdp_accountant), byte-for-byte the same algorithm in 0.9.0 (opacus/privacy_analysis.py) and
1.6.0 (opacus/accountants/analysis/rdp.py); only the RDP -> (epsilon, delta) conversion
changed, in 0.14.0: see :func:`classic_conversion` and :func:`improved_conversion`.
"""
# ruff: noqa
# mypy: ignore-errors

from __future__ import annotations

import math
from typing import List, Union

import numpy as np
from scipy import special

__all__ = ["DEFAULT_ALPHAS", "classic_conversion", "compute_rdp", "improved_conversion"]

#: Opacus's default orders (0.12.0 privacy_engine.py:18; 1.6.0 accountants/rdp.py:22); 0.9-0.11
#: had no default and their examples pass this same list (0.9.0 examples/mnist.py:234).
DEFAULT_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))

def _log_add(logx: float, logy: float) -> float:
    a, b = (min(logx, logy), max(logx, logy))
    if a == -np.inf:
        return b
    return math.log1p(math.exp(a - b)) + b

def _log_sub(logx: float, logy: float) -> float:
    if logx < logy:
        raise ValueError('The result of subtraction must be non-negative.')
    if logy == -np.inf:
        return logx
    if logx == logy:
        return -np.inf
    try:
        return math.log(math.expm1(logx - logy)) + logy
    except OverflowError:
        return logx

def _compute_log_a_for_int_alpha(q: float, sigma: float, alpha: int) -> float:
    log_a = -np.inf
    for i in range(alpha + 1):
        log_coef_i = math.log(special.binom(alpha, i)) + i * math.log(q) + (alpha - i) * math.log(1 - q)
        s = log_coef_i + (i * i - i) / (2 * sigma ** 2)
        log_a = _log_add(log_a, s)
    return float(log_a)

def _compute_log_a_for_frac_alpha(q: float, sigma: float, alpha: float) -> float:
    log_a0, log_a1 = (-np.inf, -np.inf)
    i = 0
    z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
    while True:
        coef = special.binom(alpha, i)
        log_coef = math.log(abs(coef))
        j = alpha - i
        log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
        log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
        log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
        log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
        log_s0 = log_t0 + (i * i - i) / (2 * sigma ** 2) + log_e0
        log_s1 = log_t1 + (j * j - j) / (2 * sigma ** 2) + log_e1
        if coef > 0:
            log_a0 = _log_add(log_a0, log_s0)
            log_a1 = _log_add(log_a1, log_s1)
        else:
            log_a0 = _log_sub(log_a0, log_s0)
            log_a1 = _log_sub(log_a1, log_s1)
        i += 1
        if max(log_s0, log_s1) < -30:
            break
    return _log_add(log_a0, log_a1)

def _compute_log_a(q: float, sigma: float, alpha: float) -> float:
    if float(alpha).is_integer():
        return _compute_log_a_for_int_alpha(q, sigma, int(alpha))
    else:
        return _compute_log_a_for_frac_alpha(q, sigma, alpha)

def _log_erfc(x: float) -> float:
    return math.log(2) + special.log_ndtr(-x * 2 ** 0.5)

def _compute_rdp(q: float, sigma: float, alpha: float) -> float:
    if q == 0:
        return 0
    if sigma == 0:
        return np.inf
    if q == 1.0:
        return alpha / (2 * sigma ** 2)
    if np.isinf(alpha):
        return np.inf
    return _compute_log_a(q, sigma, alpha) / (alpha - 1)

def compute_rdp(*, q: float, noise_multiplier: float, steps: int, orders: Union[List[float], float]) -> Union[List[float], float]:
    if isinstance(orders, float):
        rdp = _compute_rdp(q, noise_multiplier, orders)
    else:
        rdp = np.array([_compute_rdp(q, noise_multiplier, order) for order in orders])
    return rdp * steps


def _best(orders, eps):
    if np.isnan(eps).all():
        return math.inf, math.nan
    i = int(np.nanargmin(eps))
    return float(eps[i]), float(orders[i])


def classic_conversion(orders, rdp, delta):
    """Opacus 0.9.0-0.13.0 ``get_privacy_spent``: eps = min_a rdp_a - log(delta) / (a - 1)
    (0.9.0 privacy_analysis.py:349, 0.13.0 :298)."""
    o, r = np.atleast_1d(orders).astype(float), np.atleast_1d(rdp)
    return _best(o, r - math.log(delta) / (o - 1))


def improved_conversion(orders, rdp, delta):
    """Opacus 0.14.0-1.6.0 ``get_privacy_spent``: eps = min_a rdp_a - (log delta + log a) /
    (a - 1) + log((a - 1) / a) (0.14.0 privacy_analysis.py:300-303; 1.6.0
    accountants/analysis/rdp.py:319-323)."""
    o, r = np.atleast_1d(orders).astype(float), np.atleast_1d(rdp)
    return _best(o, r - (np.log(delta) + np.log(o)) / (o - 1) + np.log((o - 1) / o))
