"""The noise multiplier to account for Opacus's adaptive clipping (``AdaClipDPOptimizer``).

Adaptive clipping (Andrew et al., "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021, arXiv 1905.03871) releases two noisy sums per step: the clipped gradients with
noise ``sigma_eff * C`` and the number of unclipped examples with noise ``sigma_u``
(``unclipped_num_std``). Their Theorem 1 makes the pair one Gaussian mechanism with noise
multiplier ``sigma`` when ``sigma_eff = (sigma^-2 - (2 sigma_u)^-2)^(-1/2)``, so Opacus adds
``sigma_eff`` to the gradients and accounts ``sigma``:

* Opacus 1.6.0 (PR #807): ``optimizer.noise_multiplier`` is the user's ``sigma``; the
  accountant hook records it. Right as it is.
* Opacus 1.1.3-1.5.4: ``__init__`` overwrote ``optimizer.noise_multiplier`` with
  ``sigma_eff > sigma``, so every accountant recorded ``sigma_eff`` and printed too small an
  epsilon. :func:`accounting_noise_multiplier` undoes it,
  ``sigma = (sigma_eff^-2 + (2 sigma_u)^-2)^(-1/2)``, so that this package's accountants
  record what Opacus 1.6 records on every release.

Measured (``auditing/opacus_releases/modes.py``, ``"adaclip"``): with sigma = 1, sigma_u = 2
the gradient noise applied is sigma_eff = 1.0328 C on 1.5.4 and 1.6.0 alike; 1.5.4's history
holds 1.0328, 1.6.0's holds 1.0.
"""

from __future__ import annotations

import math
from typing import Any

from opacus_lastiterate.analysis.opacus_releases import installed_release

__all__ = []


def adjusts_noise_multiplier(optim: Any) -> bool:
    """True when ``optim`` is an ``AdaClipDPOptimizer`` of a release (1.1.3-1.5.4) whose
    ``noise_multiplier`` holds sigma_eff instead of the user's sigma."""
    if type(optim).__name__ != "AdaClipDPOptimizer" or not hasattr(optim, "unclipped_num_std"):
        return False
    rel = installed_release()
    return rel is not None and rel.key < (1, 6, 0)


def accounting_noise_multiplier(optim: Any) -> Any:
    """The noise multiplier an accountant must record for ``optim``'s step: Opacus 1.6's
    (``optim.noise_multiplier``), also on the releases before 1.6.0 whose
    ``AdaClipDPOptimizer`` keeps sigma_eff there (module docstring). Anything else is
    returned unchanged (and validated by the caller)."""
    sigma = optim.noise_multiplier
    if not adjusts_noise_multiplier(optim):
        return sigma
    s = float(sigma)
    if not (s > 0 and math.isfinite(s)):
        return sigma  # zero stays zero (Opacus leaves it), anything else fails validation
    return (s**-2 + (2 * float(optim.unclipped_num_std)) ** -2) ** -0.5
