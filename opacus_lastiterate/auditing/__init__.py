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

Names resolve lazily on first access (PEP 562 ``__getattr__``): importing this package loads
neither torch nor Opacus, so a pool or Ray worker, or a command that only reads run records,
pays for them only when it uses a name that needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes

if TYPE_CHECKING:  # the names resolved lazily by __getattr__, for type checkers and IDEs
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

_LAZY: dict[str, str] = {
    "AdversarialDataset": "adversaries",
    "Architecture": "input_training",
    "AuditRunner": "runner",
    "CANARY_TYPES": "input_canaries",
    "CRAFTING_OBJECTIVES": "adversarial_samples",
    "CachedTrain": "model_cache",
    "CanaryKind": "opacus_training",
    "CanaryType": "input_canaries",
    "CraftedSample": "adversarial_samples",
    "CraftingMode": "input_audit",
    "CraftingObjective": "adversarial_samples",
    "DEFAULT_MARGIN": "adversarial_samples",
    "DPSGDArithmetic": "arithmetic",
    "DiracCanary": "canaries",
    "DiracCanaryAdversary": "canaries",
    "GradientCanary": "canaries",
    "Initialisation": "input_training",
    "InputAuditReport": "input_audit",
    "InputCanary": "input_canaries",
    "InputScore": "input_canaries",
    "Insertion": "insertion",
    "MaliciousDataset": "adversaries",
    "ModelPopulation": "adversarial_samples",
    "Normalisation": "arithmetic",
    "OpacusDigitsTrainer": "opacus_training",
    "OpacusInputTrainer": "input_training",
    "PeriodicInsertion": "insertion",
    "PoissonInsertion": "insertion",
    "ProbeReport": "probe_agreement",
    "RECORD_FORMAT": "runner",
    "RandomDirectionAdversary": "canaries",
    "RandomDirectionCanary": "canaries",
    "RealOpacusAudit": "opacus_audit",
    "RunRecord": "runner",
    "RunRecords": "runner",
    "SCORE_STATISTICS": "input_canaries",
    "SampleAudit": "input_audit",
    "ScoreFunction": "runner",
    "ScoreStatistic": "input_canaries",
    "SimulatedAudit": "simulator",
    "SimulatedCoordinateAdversary": "canaries",
    "TrainFunction": "runner",
    "TruncatedRecordWarning": "runner",
    "WorstCaseLandscape": "adversaries",
    "adaptive_expansion_objective": "adversarial_samples",
    "audit_installed_opacus": "opacus_audit",
    "audit_records": "runner",
    "audit_scores": "simulator",
    "blank_canary": "input_canaries",
    "canary_gradient_norm": "worst_case_init",
    "check_disjoint_runs": "input_audit",
    "check_probe": "probe_agreement",
    "clip_backdoor_canary": "input_canaries",
    "craft_adversarial_sample": "adversarial_samples",
    "digits_data": "input_training",
    "in_distribution_canary": "input_canaries",
    "least_likely_label": "input_canaries",
    "mislabelled_canary": "input_canaries",
    "read_records": "runner",
    "run_assignment": "runner",
    "run_audit": "runner",
    "run_input_audit": "input_audit",
    "run_probe": "opacus_probe",
    "sample_scores": "input_canaries",
    "simulate_adversarial_dataset": "simulator",
    "simulate_malicious_dataset": "simulator",
    "simulate_worst_case_landscape": "simulator",
    "uniform_expansion_objective": "adversarial_samples",
    "worst_case_initialisation": "worst_case_init",
}
"""Public name -> defining submodule; resolved on first access (torch loads then)."""

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


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
