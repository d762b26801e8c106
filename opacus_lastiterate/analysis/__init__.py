"""Privacy mathematics of DP-SGD: no torch, no opacus.

Everything in this subpackage uses numpy, scipy and dp_accounting only, so it can be used
(and tested) without a deep-learning stack. Subpackages: :mod:`.audit` (statistics of
privacy auditing) and :mod:`.normalisation` (batch-size normalisation: EASGM, FEASGM, ASGM).
"""

from opacus_lastiterate.analysis.comparison import (
    EpsilonComparison,
    compare_epsilons,
    compare_epsilons_for_history,
)
from opacus_lastiterate.analysis.composition import (
    full_batch_epsilon,
    full_batch_epsilon_for_history,
    standard_epsilon,
    standard_epsilon_for_history,
)
from opacus_lastiterate.analysis.counterexamples import (
    MonotonicityCheck,
    QuadraticComparison,
    QuadraticResult,
    heuristic_monotonicity,
    heuristic_monotonicity_for_history,
    quadratic_regulariser_comparison,
    quadratic_regulariser_epsilon,
)
from opacus_lastiterate.analysis.gaussian_mechanism import gaussian_delta, gaussian_epsilon
from opacus_lastiterate.analysis.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.heuristic import (
    heuristic_delta,
    heuristic_delta_for_history,
    heuristic_epsilon,
    heuristic_epsilon_for_history,
    heuristic_pair,
)
from opacus_lastiterate.analysis.history import TrainingSegment
from opacus_lastiterate.analysis.normalisation import (
    DivisorVerdict,
    asgm_delta,
    asgm_epsilon,
    feasgm_delta,
    feasgm_epsilon,
    feasgm_verdict,
    opacus1x_batch_arithmetic,
    public_divisor_verdict,
)
from opacus_lastiterate.analysis.optimizer_weights import (
    UnsupportedOptimizerError,
    builtin_schedule,
    check_optimizer_supported,
    sgd_weights,
)
from opacus_lastiterate.analysis.weighted_heuristic import (
    WeightedHeuristicResult,
    weighted_heuristic_delta,
    weighted_heuristic_epsilon,
)

__all__ = [
    "DivisorVerdict",
    "EpsilonComparison",
    "MonotonicityCheck",
    "QuadraticComparison",
    "QuadraticResult",
    "ShiftedGaussianMixture",
    "TrainingSegment",
    "UnsupportedOptimizerError",
    "WeightedHeuristicResult",
    "asgm_delta",
    "asgm_epsilon",
    "builtin_schedule",
    "check_optimizer_supported",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "feasgm_delta",
    "feasgm_epsilon",
    "feasgm_verdict",
    "full_batch_epsilon",
    "full_batch_epsilon_for_history",
    "gaussian_delta",
    "gaussian_epsilon",
    "heuristic_delta",
    "heuristic_delta_for_history",
    "heuristic_epsilon",
    "heuristic_epsilon_for_history",
    "heuristic_monotonicity",
    "heuristic_monotonicity_for_history",
    "heuristic_pair",
    "opacus1x_batch_arithmetic",
    "public_divisor_verdict",
    "quadratic_regulariser_comparison",
    "quadratic_regulariser_epsilon",
    "sgd_weights",
    "standard_epsilon",
    "standard_epsilon_for_history",
    "weighted_heuristic_delta",
    "weighted_heuristic_epsilon",
]
