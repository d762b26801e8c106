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
    from opacus_lastiterate.accountants.any_accountant import (
        accountant_of,
        last_step_of,
        steps_of,
        take_back_steps,
    )
    from opacus_lastiterate.accountants.base import RunAccountant, sampling_of_new_accountants
    from opacus_lastiterate.accountants.incremental_rdp import IncrementalRDP
    from opacus_lastiterate.accountants.last_iterate import (
        MECHANISM,
        LastIterateAccountant,
    )
    from opacus_lastiterate.accountants.normalisation import (
        ASGM_MECHANISM,
        FEASGM_MECHANISM,
        STANDARD_ACCOUNTANTS,
        ASGMAccountant,
        FEASGMAccountant,
    )
    from opacus_lastiterate.accountants.public_divisor import (
        PUBLIC_DIVISOR_ATTRIBUTE,
        public_divisor_of,
        use_public_divisor,
    )
    from opacus_lastiterate.accountants.registration import (
        HAS_NATIVE_REGISTRY,
        register_accountant,
        registered_accountants,
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
    "ACCOUNTANTS",
    "ASGM_MECHANISM",
    "FEASGM_MECHANISM",
    "HAS_NATIVE_REGISTRY",
    "MECHANISM",
    "PUBLIC_DIVISOR_ATTRIBUTE",
    "STANDARD_ACCOUNTANTS",
    "ASGMAccountant",
    "DetectedSampling",
    "FEASGMAccountant",
    "HeuristicCalibrationWarning",
    "IncrementalRDP",
    "LastIterateAccountant",
    "NormalisationWarning",
    "RunAccountant",
    "accountant_of",
    "detect_sampling",
    "last_step_of",
    "public_divisor_of",
    "register_accountant",
    "registered_accountants",
    "sampling_of_new_accountants",
    "steps_of",
    "take_back_steps",
    "use_public_divisor",
]
