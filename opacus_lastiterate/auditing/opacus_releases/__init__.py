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
        ProbeCheck,
        ProbeReport,
        check_probe,
        check_probes,
    )
    from opacus_lastiterate.auditing.opacus_releases.probe import (
        PROBE_ACCOUNTANT,
        PROBE_DELTA,
        api_generation,
        audit_observations,
        import_opacus,
        installed_version,
        run_probe,
    )
    from opacus_lastiterate.auditing.opacus_releases.real_code_audit import (
        RealOpacusAudit,
        asgm_scores,
        audit_installed_opacus,
        feasgm_scores,
        summarise_audit,
    )

_LAZY: dict[str, str] = {
    "PROBE_ACCOUNTANT": "probe",
    "PROBE_DELTA": "probe",
    "ProbeCheck": "agreement",
    "ProbeReport": "agreement",
    "RealOpacusAudit": "real_code_audit",
    "api_generation": "probe",
    "asgm_scores": "real_code_audit",
    "audit_installed_opacus": "real_code_audit",
    "audit_observations": "probe",
    "check_probe": "agreement",
    "check_probes": "agreement",
    "feasgm_scores": "real_code_audit",
    "import_opacus": "probe",
    "installed_version": "probe",
    "run_probe": "probe",
    "summarise_audit": "real_code_audit",
}
"""Public name -> defining submodule; resolved on first access."""

__all__ = [
    "PROBE_ACCOUNTANT",
    "PROBE_DELTA",
    "ProbeCheck",
    "ProbeReport",
    "RealOpacusAudit",
    "api_generation",
    "asgm_scores",
    "audit_installed_opacus",
    "audit_observations",
    "check_probe",
    "check_probes",
    "feasgm_scores",
    "import_opacus",
    "installed_version",
    "run_probe",
    "summarise_audit",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
