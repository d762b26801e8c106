"""Opacus accountants of opacus_lastiterate.

Importing this package registers them with Opacus (see :mod:`.registration`), so that
``PrivacyEngine(accountant="last_iterate")`` works on every Opacus 1.x.
"""

from __future__ import annotations

from opacus_lastiterate.accountants.last_iterate import (
    MECHANISM,
    HeuristicCalibrationWarning,
    LastIterateAccountant,
)
from opacus_lastiterate.accountants.registration import (
    HAS_NATIVE_REGISTRY,
    register_accountant,
    registered_accountants,
)

__all__ = [
    "HAS_NATIVE_REGISTRY",
    "MECHANISM",
    "HeuristicCalibrationWarning",
    "LastIterateAccountant",
    "register_accountant",
    "registered_accountants",
]
