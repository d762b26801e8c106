"""Privacy mathematics of DP-SGD: no torch, no opacus.

Everything in this subpackage uses numpy, scipy and dp_accounting only, so it can be used
(and tested) without a deep-learning stack. Subpackages: :mod:`.audit` (statistics of
privacy auditing) and :mod:`.normalisation` (batch-size normalisation: EASGM, FEASGM, ASGM).

Names resolve lazily on first access (PEP 562 ``__getattr__``), so importing this package is
cheap and ``dp_accounting`` or ``scipy.signal`` load only with the functions that use them.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from opacus_lastiterate.exceptions import UnsupportedOptimizerError  # light: no scipy

if TYPE_CHECKING:  # the names resolved lazily by __getattr__, for type checkers and IDEs
    from opacus_lastiterate.analysis.comparison import (
        EpsilonComparison,
        compare_epsilons,
        compare_epsilons_for_history,
    )
    from opacus_lastiterate.analysis.composition import (
        FullBatchGaussian,
        StandardComposition,
        full_batch_epsilon,
        standard_epsilon,
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
        LastIterateHeuristic,
        RobustLastIterateHeuristic,
        heuristic_epsilon,
    )
    from opacus_lastiterate.analysis.incremental import IncrementalHeuristic
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
    from opacus_lastiterate.analysis.normalisation.asgm import ASGM
    from opacus_lastiterate.analysis.optimizer_weights import (
        builtin_schedule,
        check_optimizer_supported,
        sgd_weights,
    )
    from opacus_lastiterate.analysis.run import DPSGDRun, Normalisation, TrainingSegment
    from opacus_lastiterate.analysis.suffix_maximum import SuffixMaximum, certified_suffix_maximum
    from opacus_lastiterate.analysis.weighted_heuristic import (
        WeightedHeuristicResult,
        weighted_heuristic_delta,
        weighted_heuristic_epsilon,
    )

# Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "DPSGDRun": "run",
    "Normalisation": "run",
    "LastIterateHeuristic": "heuristic",
    "RobustLastIterateHeuristic": "heuristic",
    "StandardComposition": "composition",
    "FullBatchGaussian": "composition",
    "ASGM": "normalisation.asgm",
    "IncrementalHeuristic": "incremental",
    "SuffixMaximum": "suffix_maximum",
    "certified_suffix_maximum": "suffix_maximum",
    "DivisorVerdict": "normalisation",
    "EpsilonComparison": "comparison",
    "MonotonicityCheck": "counterexamples",
    "QuadraticComparison": "counterexamples",
    "QuadraticResult": "counterexamples",
    "ShiftedGaussianMixture": "gaussian_mixture",
    "TrainingSegment": "run",
    "WeightedHeuristicResult": "weighted_heuristic",
    "asgm_delta": "normalisation",
    "asgm_epsilon": "normalisation",
    "builtin_schedule": "optimizer_weights",
    "check_optimizer_supported": "optimizer_weights",
    "compare_epsilons": "comparison",
    "compare_epsilons_for_history": "comparison",
    "feasgm_delta": "normalisation",
    "feasgm_epsilon": "normalisation",
    "feasgm_verdict": "normalisation",
    "full_batch_epsilon": "composition",
    "gaussian_delta": "gaussian_mechanism",
    "gaussian_epsilon": "gaussian_mechanism",
    "heuristic_epsilon": "heuristic",
    "heuristic_monotonicity": "counterexamples",
    "heuristic_monotonicity_for_history": "counterexamples",
    "opacus1x_batch_arithmetic": "normalisation",
    "public_divisor_verdict": "normalisation",
    "quadratic_regulariser_comparison": "counterexamples",
    "quadratic_regulariser_epsilon": "counterexamples",
    "sgd_weights": "optimizer_weights",
    "standard_epsilon": "composition",
    "weighted_heuristic_delta": "weighted_heuristic",
    "weighted_heuristic_epsilon": "weighted_heuristic",
}

__all__ = [
    "ASGM",
    "DPSGDRun",
    "DivisorVerdict",
    "EpsilonComparison",
    "FullBatchGaussian",
    "IncrementalHeuristic",
    "LastIterateHeuristic",
    "MonotonicityCheck",
    "Normalisation",
    "QuadraticComparison",
    "QuadraticResult",
    "RobustLastIterateHeuristic",
    "ShiftedGaussianMixture",
    "StandardComposition",
    "SuffixMaximum",
    "TrainingSegment",
    "UnsupportedOptimizerError",
    "WeightedHeuristicResult",
    "asgm_delta",
    "asgm_epsilon",
    "builtin_schedule",
    "certified_suffix_maximum",
    "check_optimizer_supported",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "feasgm_delta",
    "feasgm_epsilon",
    "feasgm_verdict",
    "full_batch_epsilon",
    "gaussian_delta",
    "gaussian_epsilon",
    "heuristic_epsilon",
    "heuristic_monotonicity",
    "heuristic_monotonicity_for_history",
    "opacus1x_batch_arithmetic",
    "public_divisor_verdict",
    "quadratic_regulariser_comparison",
    "quadratic_regulariser_epsilon",
    "sgd_weights",
    "standard_epsilon",
    "weighted_heuristic_delta",
    "weighted_heuristic_epsilon",
]


def __getattr__(name: str) -> Any:
    """Resolve a public name or a submodule on first access (PEP 562)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value  # later accesses skip this function
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # e.g. analysis.heuristic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
