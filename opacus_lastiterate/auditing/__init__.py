"""Attacks for auditing DP-SGD when only the final model is released (the torch side).

One subpackage per concept:

- :mod:`.gradient_space`: gradient canaries, their insertion, the adversaries (adversarial,
  worst-case landscape, malicious data sets), one DP-SGD step's arithmetic, the vectorised
  simulator (:func:`audit_scores`) and the exact epsilons of those attacks (numpy/scipy);
- :mod:`.input_space`: input-space canaries and their scores, crafted adversarial samples,
  worst-case initialisation, an Opacus trainer on digits with an input canary, the
  canary-vs-crafted audit and its model cache (``docs/input_audits.md``);
- :mod:`.runner`: many-run audits of real training functions (contract, process pool, Ray,
  resumable JSON-lines records);
- :mod:`.opacus_releases`: what each Opacus release 0.9.0-1.6.0 does, on its real code
  (probes, their agreement with the release model
  :mod:`opacus_lastiterate.analysis.opacus_versions`, and the worst-case audit of real Opacus
  code; ``docs/opacus_versions.md``);
- :mod:`.opacus_training`: a ready-made Opacus trainer on digits (gradient or input canary)
  for the runner;
- :mod:`.wiring`: the wiring check of a real Opacus set-up (every trainable parameter has
  per-sample gradients, is clipped and noised at the stated scale; frozen ones stay frozen;
  ``docs/language_models.md``).

The statistics live in :mod:`opacus_lastiterate.analysis.audit`; every audit's numbers come
from :class:`~opacus_lastiterate.analysis.audit.ScoreAudit`. Background, adversaries and
references: ``docs/auditing.md``.

Names resolve lazily on first access (PEP 562 ``__getattr__``): importing this package loads
neither torch nor Opacus, so a pool or Ray worker, or a command that only reads run records,
pays for them only when it uses a name that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes

if TYPE_CHECKING:
    from opacus_lastiterate.auditing.gradient_space.adversaries import (
        AdversarialDataset,
        MaliciousDataset,
    )
    from opacus_lastiterate.auditing.gradient_space.arithmetic import DPSGDArithmetic
    from opacus_lastiterate.auditing.gradient_space.canaries import (
        DiracCanary,
        DiracCanaryAdversary,
        SimulatedCoordinateAdversary,
    )
    from opacus_lastiterate.auditing.gradient_space.insertion import (
        Insertion,
        PoissonInsertion,
    )
    from opacus_lastiterate.auditing.gradient_space.simulator import (
        SimulatedAudit,
        audit_scores,
        simulate_adversarial_dataset,
        simulate_malicious_dataset,
    )
    from opacus_lastiterate.auditing.input_space.adversarial_samples import (
        CRAFTING_OBJECTIVES,  # the names resolved lazily by __getattr__, for type checkers and IDEs
        CraftedSample,
        craft_adversarial_sample,
    )
    from opacus_lastiterate.auditing.input_space.audit import (
        InputAuditReport,
        SampleAudit,
        run_input_audit,
    )
    from opacus_lastiterate.auditing.input_space.canaries import (
        InputCanary,
        InputScore,
        blank_canary,
        clip_backdoor_canary,
        in_distribution_canary,
        least_likely_label,
        mislabelled_canary,
    )
    from opacus_lastiterate.auditing.input_space.training import (
        OpacusInputTrainer,
        digits_data,
    )
    from opacus_lastiterate.auditing.opacus_releases.agreement import ProbeReport, check_probe
    from opacus_lastiterate.auditing.opacus_releases.real_code_audit import (
        RealOpacusAudit,
        audit_installed_opacus,
    )
    from opacus_lastiterate.auditing.opacus_training import OpacusDigitsTrainer
    from opacus_lastiterate.auditing.runner import (
        RECORD_FORMAT,
        AuditRunner,
        RunRecord,
        RunRecords,
        ScoreFunction,
        TrainFunction,
        audit_records,
        read_records,
        run_audit,
    )
    from opacus_lastiterate.auditing.wiring import (
        WiringCheck,
        check_private_training,
    )

_LAZY: dict[str, str] = {
    "CRAFTING_OBJECTIVES": "input_space.adversarial_samples",
    "AdversarialDataset": "gradient_space.adversaries",
    "AuditRunner": "runner",
    "CraftedSample": "input_space.adversarial_samples",
    "DPSGDArithmetic": "gradient_space.arithmetic",
    "DiracCanary": "gradient_space.canaries",
    "DiracCanaryAdversary": "gradient_space.canaries",
    "InputAuditReport": "input_space.audit",
    "InputCanary": "input_space.canaries",
    "InputScore": "input_space.canaries",
    "Insertion": "gradient_space.insertion",
    "MaliciousDataset": "gradient_space.adversaries",
    "OpacusDigitsTrainer": "opacus_training",
    "OpacusInputTrainer": "input_space.training",
    "PoissonInsertion": "gradient_space.insertion",
    "ProbeReport": "opacus_releases.agreement",
    "RECORD_FORMAT": "runner",
    "RealOpacusAudit": "opacus_releases.real_code_audit",
    "RunRecord": "runner",
    "RunRecords": "runner",
    "SampleAudit": "input_space.audit",
    "ScoreFunction": "runner",
    "SimulatedAudit": "gradient_space.simulator",
    "SimulatedCoordinateAdversary": "gradient_space.canaries",
    "TrainFunction": "runner",
    "WiringCheck": "wiring",
    "audit_installed_opacus": "opacus_releases.real_code_audit",
    "audit_records": "runner",
    "audit_scores": "gradient_space.simulator",
    "blank_canary": "input_space.canaries",
    "check_private_training": "wiring",
    "check_probe": "opacus_releases.agreement",
    "clip_backdoor_canary": "input_space.canaries",
    "craft_adversarial_sample": "input_space.adversarial_samples",
    "digits_data": "input_space.training",
    "in_distribution_canary": "input_space.canaries",
    "least_likely_label": "input_space.canaries",
    "mislabelled_canary": "input_space.canaries",
    "read_records": "runner",
    "run_audit": "runner",
    "run_input_audit": "input_space.audit",
    "simulate_adversarial_dataset": "gradient_space.simulator",
    "simulate_malicious_dataset": "gradient_space.simulator",
}
"""Public name -> defining submodule; resolved on first access (torch loads then)."""

__all__ = [
    "CRAFTING_OBJECTIVES",
    "RECORD_FORMAT",
    "AdversarialDataset",
    "AuditRunner",
    "CraftedSample",
    "DPSGDArithmetic",
    "DiracCanary",
    "DiracCanaryAdversary",
    "InputAuditReport",
    "InputCanary",
    "InputScore",
    "Insertion",
    "MaliciousDataset",
    "OpacusDigitsTrainer",
    "OpacusInputTrainer",
    "PoissonInsertion",
    "ProbeReport",
    "RealOpacusAudit",
    "RunRecord",
    "RunRecords",
    "SampleAudit",
    "ScoreFunction",
    "SimulatedAudit",
    "SimulatedCoordinateAdversary",
    "TrainFunction",
    "WiringCheck",
    "audit_installed_opacus",
    "audit_records",
    "audit_scores",
    "blank_canary",
    "check_private_training",
    "check_probe",
    "clip_backdoor_canary",
    "craft_adversarial_sample",
    "digits_data",
    "in_distribution_canary",
    "least_likely_label",
    "mislabelled_canary",
    "read_records",
    "run_audit",
    "run_input_audit",
    "simulate_adversarial_dataset",
    "simulate_malicious_dataset",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
