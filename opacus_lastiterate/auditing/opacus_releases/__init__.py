"""What each Opacus release does, measured on its real code (``docs/opacus_versions.md``).

The concept has a math half and a torch half:

- :mod:`opacus_lastiterate.analysis.opacus_versions` (the math layer, no torch): the release
  model -- divisor, noise scale, empty batches, example weighting and printed epsilon of
  every release 0.9.0-1.6.0, and the privacy model each one implements;
- :mod:`.probe`: real-code probes of an installed release (runnable by path where only torch
  and that release are installed: it imports nothing of this package);
- :mod:`.agreement`: a probe record checked against the release model;
- :mod:`.real_code_audit`: the worst-case audit of real Opacus code (epsilons from the
  probe's observations).

Names resolve lazily on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes

if TYPE_CHECKING:  # the names resolved lazily by __getattr__, for type checkers and IDEs
    from opacus_lastiterate.auditing.opacus_releases.agreement import (
        ProbeReport,
        check_probe,
    )
    from opacus_lastiterate.auditing.opacus_releases.real_code_audit import (
        RealOpacusAudit,
        audit_installed_opacus,
    )

_LAZY: dict[str, str] = {
    "ProbeReport": "agreement",
    "RealOpacusAudit": "real_code_audit",
    "audit_installed_opacus": "real_code_audit",
    "check_probe": "agreement",
}
"""Public name -> defining submodule; resolved on first access."""

__all__ = [
    "ProbeReport",
    "RealOpacusAudit",
    "audit_installed_opacus",
    "check_probe",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
