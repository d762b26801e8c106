"""Opacus accountants of opacus_lastiterate.

Importing this package registers them with Opacus (see :mod:`.registration`) and lets
``make_private`` tell them which batches the run draws (:mod:`.engine_sampling`), so that
``PrivacyEngine(accountant="last_iterate")`` (and ``"asgm"``, ``"feasgm"``) works on every
Opacus 1.x. :func:`use_public_divisor` is the one-line fix for Opacus 1.x's data-dependent divisor
(``docs/normalisation.md``, "The fix: a public divisor").
"""

from __future__ import annotations

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.accountants", "torch", "opacus"):  # clear error without torch
    from opacus_lastiterate.accountants import engine_sampling
    from opacus_lastiterate.accountants.base import RunAccountant
    from opacus_lastiterate.accountants.last_iterate import (
        LastIterateAccountant,
    )
    from opacus_lastiterate.accountants.normalisation import (
        ASGMAccountant,
        FEASGMAccountant,
    )
    from opacus_lastiterate.accountants.public_divisor import (
        public_divisor_of,
        use_public_divisor,
    )
    from opacus_lastiterate.accountants.registration import (
        register_accountant,
    )
    from opacus_lastiterate.accountants.sampling_detection import DetectedSampling, detect_sampling
from opacus_lastiterate.exceptions import HeuristicCalibrationWarning, NormalisationWarning

ACCOUNTANTS: tuple[type[RunAccountant], ...] = (
    LastIterateAccountant,
    FEASGMAccountant,
    ASGMAccountant,
)
"""Every accountant of this package; each is registered under its ``mechanism()`` name."""

for _accountant in ACCOUNTANTS:  # the one place where registration happens
    register_accountant(_accountant.mechanism(), _accountant)
del _accountant
engine_sampling.install()  # make_private tells our accountants which batches it draws

__all__ = [
    "ASGMAccountant",
    "DetectedSampling",
    "FEASGMAccountant",
    "HeuristicCalibrationWarning",
    "LastIterateAccountant",
    "NormalisationWarning",
    "RunAccountant",
    "detect_sampling",
    "public_divisor_of",
    "register_accountant",
    "use_public_divisor",
]
