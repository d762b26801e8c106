"""Privacy mathematics of DP-SGD: no torch, no opacus.

Everything in this subpackage uses numpy, scipy and dp_accounting only, so it can be used
(and tested) without a deep-learning stack.
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

__all__ = [
    "EpsilonComparison",
    "ShiftedGaussianMixture",
    "TrainingSegment",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "full_batch_epsilon",
    "full_batch_epsilon_for_history",
    "gaussian_delta",
    "gaussian_epsilon",
    "heuristic_delta",
    "heuristic_delta_for_history",
    "heuristic_epsilon",
    "heuristic_epsilon_for_history",
    "heuristic_pair",
    "standard_epsilon",
    "standard_epsilon_for_history",
]
