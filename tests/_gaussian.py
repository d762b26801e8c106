"""An independent closed form for tests: the Gaussian mechanism's epsilon (scipy only)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm


def gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """epsilon of the Gaussian mechanism with sensitivity / noise = mu at ``delta`` (Balle and
    Wang's delta(eps), inverted by brentq to 1e-12)."""

    def excess(eps: float) -> float:
        return norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return float(brentq(excess, 0.0, 100.0, xtol=1e-12))
