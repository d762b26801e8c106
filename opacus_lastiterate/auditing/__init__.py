"""Attacks for auditing DP-SGD when only the final model is released (the torch side).

- :mod:`.canaries`: gradient canaries (Dirac A_GC-R, simulated coordinate A_GC-S, random
  direction) with craft / insert / score, for numpy arrays and torch tensors;
- :mod:`.insertion`: Poisson-sampled or every-k-steps canary insertion;
- :mod:`.adversaries`: adversarial data set (other gradients zero), A_S^{h*} (worst-case
  landscape after one insertion, Cebere et al.), malicious data set (last-iterate paper,
  Appendix C);
- :mod:`.arithmetic`: one DP-SGD step as configured (SGM / EASGM / ASGM);
- :mod:`.simulator`: vectorised, seeded numpy simulation of the few-coordinate attacks,
  plus :func:`audit_scores` (Clopper-Pearson bound and Gaussian-DP estimate);
- :mod:`.runner`: many-run audits of real training functions (process pool or Ray);
  :mod:`.run_records`: their resumable JSON-lines record files; :mod:`.opacus_training`: a
  ready-made Opacus trainer;
- :mod:`.opacus_probe`: real-code probes of any Opacus release 0.9.0-1.6.0 (divisor, noise
  scale, empty batches, printed epsilon; runnable by path where only torch and that release
  are installed), :mod:`.probe_agreement`: their comparison with the version model, and
  :mod:`.opacus_audit`: the worst-case audit of real Opacus code (``docs/opacus_versions.md``).

The statistics live in :mod:`opacus_lastiterate.analysis.audit`. Background, adversaries and
references: ``docs/auditing.md``.
"""

from opacus_lastiterate.auditing.adversaries import (
    AdversarialDataset,
    MaliciousDataset,
    WorstCaseLandscape,
)
from opacus_lastiterate.auditing.arithmetic import DPSGDArithmetic, Normalisation
from opacus_lastiterate.auditing.canaries import (
    DiracCanary,
    DiracCanaryAdversary,
    GradientCanary,
    RandomDirectionAdversary,
    RandomDirectionCanary,
    SimulatedCoordinateAdversary,
)
from opacus_lastiterate.auditing.insertion import Insertion, PeriodicInsertion, PoissonInsertion
from opacus_lastiterate.auditing.opacus_audit import RealOpacusAudit, audit_installed_opacus
from opacus_lastiterate.auditing.opacus_probe import run_probe
from opacus_lastiterate.auditing.opacus_training import CanaryKind, OpacusDigitsTrainer
from opacus_lastiterate.auditing.probe_agreement import ProbeReport, check_probe
from opacus_lastiterate.auditing.runner import (
    RECORD_FORMAT,
    AuditRunner,
    RunRecord,
    RunRecords,
    ScoreFunction,
    TrainFunction,
    TruncatedRecordWarning,
    audit_records,
    read_records,
    run_assignment,
    run_audit,
)
from opacus_lastiterate.auditing.simulator import (
    SimulatedAudit,
    audit_scores,
    simulate_adversarial_dataset,
    simulate_malicious_dataset,
    simulate_worst_case_landscape,
)

__all__ = [
    "RECORD_FORMAT",
    "AdversarialDataset",
    "AuditRunner",
    "CanaryKind",
    "DPSGDArithmetic",
    "DiracCanary",
    "DiracCanaryAdversary",
    "GradientCanary",
    "Insertion",
    "MaliciousDataset",
    "Normalisation",
    "OpacusDigitsTrainer",
    "PeriodicInsertion",
    "PoissonInsertion",
    "ProbeReport",
    "RandomDirectionAdversary",
    "RandomDirectionCanary",
    "RealOpacusAudit",
    "RunRecord",
    "RunRecords",
    "ScoreFunction",
    "SimulatedAudit",
    "SimulatedCoordinateAdversary",
    "TrainFunction",
    "TruncatedRecordWarning",
    "WorstCaseLandscape",
    "audit_installed_opacus",
    "audit_records",
    "audit_scores",
    "check_probe",
    "read_records",
    "run_assignment",
    "run_audit",
    "run_probe",
    "simulate_adversarial_dataset",
    "simulate_malicious_dataset",
    "simulate_worst_case_landscape",
]
