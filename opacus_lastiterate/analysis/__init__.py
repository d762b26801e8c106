"""Privacy mathematics of DP-SGD: no torch, no opacus.

Everything in this subpackage uses numpy, scipy and dp_accounting only, so it can be used
(and tested) without a deep-learning stack. One home per concept:

* :mod:`.run`: the description of a DP-SGD run (:class:`DPSGDRun`), validated once;
* :mod:`.sampling`: how its batches were drawn (Poisson, shuffled, deterministic,
  balls-in-bins, unknown), part of the run description; :mod:`.sampling_heuristic` and
  :mod:`.sampling_standard` the numbers per scheme (:mod:`.sampling_allocation`: the
  balls-in-bins standard number, random allocation via pld-accounting);
* :mod:`.privacy_models`: the registry of privacy models (one name each) and the chooser:
  ``privacy_models.choose(name, ...)`` decides how each number is computed for a run (its
  sampling scheme, its per-step weights), ``privacy_models.privacy_model(name, run)`` builds
  that model (not re-exported here, where ``privacy_model`` is the module of the
  :class:`PrivacyModel` protocol); :mod:`.kept_model`: :class:`KeptModel`, the same choice for
  a run kept as it grows (per-step accounting);
* :mod:`.last_iterate`: the last-iterate heuristic, its robust and weighted forms, per-step
  accounting and the known counterexamples;
* :mod:`.baselines`: standard composition and full-batch DP-GD;
* :mod:`.normalisation`: batch-size normalisation (EASGM, FEASGM, ASGM);
* :mod:`.audit`: the statistics of privacy auditing;
* :mod:`.comparison`: every number of one run side by side;
* :mod:`.dp_accounting_accountant`: the heuristic as a ``dp_accounting`` accountant (events
  composed by JAX or TensorFlow training code);
* :mod:`.calibration` and :mod:`.hyperparameter_plan`: the noise multiplier for a target
  epsilon, and batch sizes with equal heuristic epsilon;
* :mod:`.opacus_versions`: what each Opacus release 0.9.0-1.6.0 computes.

Names resolve lazily on first access (PEP 562 ``__getattr__``), so importing this package is
cheap and ``dp_accounting`` or ``scipy.signal`` load only with the functions that use them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes
from opacus_lastiterate.exceptions import UnsupportedOptimizerError  # light: no scipy

if TYPE_CHECKING:  # the names resolved lazily by __getattr__, for type checkers and IDEs
    from opacus_lastiterate.analysis.baselines.composition import (
        FullBatchGaussian,
        RDPComposition,
        StandardComposition,
        full_batch_delta,
        full_batch_epsilon,
        standard_delta,
        standard_epsilon,
        standard_rdp_delta,
        standard_rdp_epsilon,
    )
    from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
        gaussian_delta,
        gaussian_epsilon,
    )
    from opacus_lastiterate.analysis.calibration import (
        calibrate_noise_multiplier,
    )
    from opacus_lastiterate.analysis.comparison import (
        EpsilonComparison,
        compare_epsilons,
        compare_epsilons_for_history,
    )
    from opacus_lastiterate.analysis.dp_accounting_accountant import (
        LastIterateHeuristicAccountant,
    )
    from opacus_lastiterate.analysis.hyperparameter_plan import BatchSizePlan, plan_batch_sizes
    from opacus_lastiterate.analysis.kept_model import KeptModel
    from opacus_lastiterate.analysis.last_iterate.counterexamples import (
        MonotonicityCheck,
        QuadraticResult,
        heuristic_monotonicity,
        quadratic_regulariser_epsilon,
    )
    from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
    from opacus_lastiterate.analysis.last_iterate.heuristic import (
        LastIterateHeuristic,
        RobustLastIterateHeuristic,
    )
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
        builtin_schedule,
        sgd_weights,
    )
    from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
        WeightedHeuristicResult,
    )
    from opacus_lastiterate.analysis.normalisation import (
        DivisorVerdict,
        asgm_delta,
        asgm_epsilon,
    )
    from opacus_lastiterate.analysis.normalisation.asgm import ASGM
    from opacus_lastiterate.analysis.normalisation.divisor_leak import FEASGM
    from opacus_lastiterate.analysis.opacus_versions import (
        OPACUS_RELEASES,
        OpacusRelease,
        VersionComparison,
        VersionConfig,
        compare_versions,
    )
    from opacus_lastiterate.analysis.privacy_model import PrivacyModel
    from opacus_lastiterate.analysis.privacy_models import (
        PRIVACY_MODELS,
    )
    from opacus_lastiterate.analysis.run import (
        DPSGDRun,
        Normalisation,
        TrainingSegment,
    )
    from opacus_lastiterate.analysis.sampling import (
        BallsInBins,
        DeterministicBatches,
        PoissonSampling,
        ShuffledBatches,
        UnknownSampling,
    )
    from opacus_lastiterate.analysis.sampling_allocation import (
        BallsInBinsBound,
        random_allocation_pld,
    )
    from opacus_lastiterate.analysis.sampling_standard import (
        NoAmplificationBound,
        PoissonAssumed,
        ShuffleLowerBound,
    )

# Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "BatchSizePlan": "hyperparameter_plan",
    "calibrate_noise_multiplier": "calibration",
    "plan_batch_sizes": "hyperparameter_plan",
    "OPACUS_RELEASES": "opacus_versions",
    "OpacusRelease": "opacus_versions",
    "VersionComparison": "opacus_versions",
    "VersionConfig": "opacus_versions",
    "compare_versions": "opacus_versions",
    "DPSGDRun": "run",
    "LastIterateHeuristicAccountant": "dp_accounting_accountant",
    "BallsInBins": "sampling",
    "DeterministicBatches": "sampling",
    "PoissonSampling": "sampling",
    "ShuffledBatches": "sampling",
    "UnknownSampling": "sampling",
    "NoAmplificationBound": "sampling_standard",
    "BallsInBinsBound": "sampling_allocation",
    "random_allocation_pld": "sampling_allocation",
    "PoissonAssumed": "sampling_standard",
    "ShuffleLowerBound": "sampling_standard",
    "FEASGM": "normalisation.divisor_leak",
    "PrivacyModel": "privacy_model",
    "PRIVACY_MODELS": "privacy_models",
    "RDPComposition": "baselines.composition",
    "full_batch_delta": "baselines.composition",
    "standard_delta": "baselines.composition",
    "standard_rdp_delta": "baselines.composition",
    "standard_rdp_epsilon": "baselines.composition",
    "Normalisation": "run",
    "LastIterateHeuristic": "last_iterate.heuristic",
    "RobustLastIterateHeuristic": "last_iterate.heuristic",
    "StandardComposition": "baselines.composition",
    "FullBatchGaussian": "baselines.composition",
    "ASGM": "normalisation.asgm",
    "KeptModel": "kept_model",
    "DivisorVerdict": "normalisation",
    "EpsilonComparison": "comparison",
    "MonotonicityCheck": "last_iterate.counterexamples",
    "QuadraticResult": "last_iterate.counterexamples",
    "ShiftedGaussianMixture": "last_iterate.gaussian_mixture",
    "TrainingSegment": "run",
    "WeightedHeuristicResult": "last_iterate.weighted_heuristic",
    "asgm_delta": "normalisation",
    "asgm_epsilon": "normalisation",
    "builtin_schedule": "last_iterate.optimizer_weights",
    "compare_epsilons": "comparison",
    "compare_epsilons_for_history": "comparison",
    "full_batch_epsilon": "baselines.composition",
    "gaussian_delta": "baselines.gaussian_mechanism",
    "gaussian_epsilon": "baselines.gaussian_mechanism",
    "heuristic_monotonicity": "last_iterate.counterexamples",
    "quadratic_regulariser_epsilon": "last_iterate.counterexamples",
    "sgd_weights": "last_iterate.optimizer_weights",
    "standard_epsilon": "baselines.composition",
}

__all__ = [
    "ASGM",
    "FEASGM",
    "OPACUS_RELEASES",
    "PRIVACY_MODELS",
    "BallsInBins",
    "BallsInBinsBound",
    "BatchSizePlan",
    "DPSGDRun",
    "DeterministicBatches",
    "DivisorVerdict",
    "EpsilonComparison",
    "FullBatchGaussian",
    "KeptModel",
    "LastIterateHeuristic",
    "LastIterateHeuristicAccountant",
    "MonotonicityCheck",
    "NoAmplificationBound",
    "Normalisation",
    "OpacusRelease",
    "PoissonAssumed",
    "PoissonSampling",
    "PrivacyModel",
    "QuadraticResult",
    "RDPComposition",
    "RobustLastIterateHeuristic",
    "ShiftedGaussianMixture",
    "ShuffleLowerBound",
    "ShuffledBatches",
    "StandardComposition",
    "TrainingSegment",
    "UnknownSampling",
    "UnsupportedOptimizerError",
    "VersionComparison",
    "VersionConfig",
    "WeightedHeuristicResult",
    "asgm_delta",
    "asgm_epsilon",
    "builtin_schedule",
    "calibrate_noise_multiplier",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "compare_versions",
    "full_batch_delta",
    "full_batch_epsilon",
    "gaussian_delta",
    "gaussian_epsilon",
    "heuristic_monotonicity",
    "plan_batch_sizes",
    "quadratic_regulariser_epsilon",
    "random_allocation_pld",
    "sgd_weights",
    "standard_delta",
    "standard_epsilon",
    "standard_rdp_delta",
    "standard_rdp_epsilon",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
