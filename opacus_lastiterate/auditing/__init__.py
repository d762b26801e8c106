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
- :mod:`.input_canaries`: input-space canaries (in-distribution, mislabelled, blank,
  clip-backdoor, user-supplied) and their loss / logit-margin scores;
  :mod:`.adversarial_samples`: crafted adversarial samples (uniform and adaptive expansion);
  :mod:`.worst_case_init`: worst-case initialisation; :mod:`.input_training`: an Opacus
  trainer on digits with an input canary; :mod:`.input_audit`: canary vs crafted samples on
  the same evaluation runs, crafted on disjoint runs; :mod:`.model_cache`: final models kept
  on disk (``docs/input_audits.md``);
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

from opacus_lastiterate.auditing.adversarial_samples import (
    CRAFTING_OBJECTIVES,
    DEFAULT_MARGIN,
    CraftedSample,
    CraftingObjective,
    ModelPopulation,
    adaptive_expansion_objective,
    craft_adversarial_sample,
    uniform_expansion_objective,
)
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
from opacus_lastiterate.auditing.input_audit import (
    CraftingMode,
    InputAuditReport,
    SampleAudit,
    check_disjoint_runs,
    run_input_audit,
)
from opacus_lastiterate.auditing.input_canaries import (
    CANARY_TYPES,
    SCORE_STATISTICS,
    CanaryType,
    InputCanary,
    InputScore,
    ScoreStatistic,
    blank_canary,
    clip_backdoor_canary,
    in_distribution_canary,
    least_likely_label,
    mislabelled_canary,
    sample_scores,
)
from opacus_lastiterate.auditing.input_training import (
    Architecture,
    Initialisation,
    OpacusInputTrainer,
    digits_data,
)
from opacus_lastiterate.auditing.insertion import Insertion, PeriodicInsertion, PoissonInsertion
from opacus_lastiterate.auditing.model_cache import CachedTrain
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
from opacus_lastiterate.auditing.worst_case_init import (
    canary_gradient_norm,
    worst_case_initialisation,
)

__all__ = [
    "CANARY_TYPES",
    "CRAFTING_OBJECTIVES",
    "DEFAULT_MARGIN",
    "RECORD_FORMAT",
    "SCORE_STATISTICS",
    "AdversarialDataset",
    "Architecture",
    "AuditRunner",
    "CachedTrain",
    "CanaryKind",
    "CanaryType",
    "CraftedSample",
    "CraftingMode",
    "CraftingObjective",
    "DPSGDArithmetic",
    "DiracCanary",
    "DiracCanaryAdversary",
    "GradientCanary",
    "Initialisation",
    "InputAuditReport",
    "InputCanary",
    "InputScore",
    "Insertion",
    "MaliciousDataset",
    "ModelPopulation",
    "Normalisation",
    "OpacusDigitsTrainer",
    "OpacusInputTrainer",
    "PeriodicInsertion",
    "PoissonInsertion",
    "ProbeReport",
    "RandomDirectionAdversary",
    "RandomDirectionCanary",
    "RealOpacusAudit",
    "RunRecord",
    "RunRecords",
    "SampleAudit",
    "ScoreFunction",
    "ScoreStatistic",
    "SimulatedAudit",
    "SimulatedCoordinateAdversary",
    "TrainFunction",
    "TruncatedRecordWarning",
    "WorstCaseLandscape",
    "adaptive_expansion_objective",
    "audit_installed_opacus",
    "audit_records",
    "audit_scores",
    "blank_canary",
    "canary_gradient_norm",
    "check_disjoint_runs",
    "check_probe",
    "clip_backdoor_canary",
    "craft_adversarial_sample",
    "digits_data",
    "in_distribution_canary",
    "least_likely_label",
    "mislabelled_canary",
    "read_records",
    "run_assignment",
    "run_audit",
    "run_input_audit",
    "run_probe",
    "sample_scores",
    "simulate_adversarial_dataset",
    "simulate_malicious_dataset",
    "simulate_worst_case_landscape",
    "uniform_expansion_objective",
    "worst_case_initialisation",
]
