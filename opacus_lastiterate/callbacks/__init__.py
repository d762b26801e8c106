"""Training-time plug-ins for Opacus runs (torch side).

- :mod:`.canary_audit`: in-training canary audit of the final model in one run (gradient
  and input canaries, one-run lower bounds beside the heuristic and standard epsilons).
"""

from opacus_lastiterate.callbacks.canary_audit import (
    CanaryAuditResult,
    InputCanaries,
    InTrainingAuditReport,
    InTrainingCanaryAudit,
    make_input_canaries,
)

__all__ = [
    "CanaryAuditResult",
    "InTrainingAuditReport",
    "InTrainingCanaryAudit",
    "InputCanaries",
    "make_input_canaries",
]
