"""Warning classes raised by the audit statistics (defined in :mod:`opacus_lastiterate.exceptions`).

Filter them by class, e.g. ``warnings.simplefilter("error", OneRunDeltaWarning)``; every one
is an :class:`~opacus_lastiterate.exceptions.OpacusLastIterateWarning`.
"""

from __future__ import annotations

from opacus_lastiterate.exceptions import (
    AuditWarning,
    NonRandomizedInclusionWarning,
    OneRunDeltaWarning,
)

__all__ = ["AuditWarning", "NonRandomizedInclusionWarning", "OneRunDeltaWarning"]
