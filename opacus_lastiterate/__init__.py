"""opacus-lastiterate: final-model privacy accounting and auditing for DP-SGD.

Layout: :mod:`opacus_lastiterate.analysis` is the mathematics (numpy/scipy/dp_accounting,
no torch); :mod:`opacus_lastiterate.accountants` adapts it to Opacus;
:mod:`opacus_lastiterate.auditing` holds the attacks, simulator and many-run runner (torch);
:mod:`opacus_lastiterate.exceptions` holds every warning and error class;
:mod:`opacus_lastiterate.figures` recomputes the papers' figures and :mod:`opacus_lastiterate.cli`
is the ``opacus-lastiterate`` command line (click).

Importing this package is light: it loads neither torch, opacus nor the mathematics.

* **Opacus registration.** ``PrivacyEngine(accountant="last_iterate")`` (and ``"asgm"``,
  ``"feasgm"``) works on Opacus 1.0 to 1.6 once this package is imported, whether Opacus was
  imported before or after it. The accountants are registered by a post-import hook on
  ``opacus`` (``wrapt.register_post_import_hook``, which also runs the hook at once if Opacus
  is already imported). Chosen over importing Opacus here because that costs seconds (torch)
  for users of the mathematics and the command line, and over patching Opacus lazily by hand
  because wrapt's import hook is a maintained, thread-safe implementation of exactly this.
* **Lazy names.** The public names listed in ``__all__`` resolve on first access (PEP 562
  module ``__getattr__``): ``opacus_lastiterate.LastIterateAccountant`` imports the
  accountants (and so torch and Opacus) only then; the analysis names import the mathematics
  only then. ``from opacus_lastiterate import *`` resolves them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate import _opacus_hook
from opacus_lastiterate._lazy import lazy_attributes
from opacus_lastiterate.exceptions import (
    AuditWarning,
    HeuristicCalibrationWarning,
    MonitorWarning,
    NonMonotoneHeuristicWarning,
    NonRandomizedInclusionWarning,
    NormalisationWarning,
    OneRunDeltaWarning,
    OpacusLastIterateWarning,
    OptimizerTraceWarning,
    SamplingWarning,
    TruncatedRecordWarning,
    UnsupportedOptimizerError,
    WeightedAccuracyWarning,
    ZeroNoiseWarning,
)

if TYPE_CHECKING:  # the names resolved lazily by __getattr__, for type checkers and IDEs
    from opacus_lastiterate.accountants import (
        ASGMAccountant,
        FEASGMAccountant,
        LastIterateAccountant,
        public_divisor_of,
        register_accountant,
        use_public_divisor,
    )
    from opacus_lastiterate.analysis import (
        DPSGDRun,
        EpsilonComparison,
        LastIterateHeuristic,
        Normalisation,
        RobustLastIterateHeuristic,
        StandardComposition,
        TrainingSegment,
        compare_epsilons,
        compare_epsilons_for_history,
        full_batch_epsilon,
        heuristic_epsilon,
        standard_epsilon,
    )

__version__ = "0.1.0"

# Lazily resolved public names -> the module that defines them.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        (
            "DPSGDRun",
            "EpsilonComparison",
            "LastIterateHeuristic",
            "Normalisation",
            "RobustLastIterateHeuristic",
            "StandardComposition",
            "TrainingSegment",
            "compare_epsilons",
            "compare_epsilons_for_history",
            "full_batch_epsilon",
            "heuristic_epsilon",
            "standard_epsilon",
        ),
        "opacus_lastiterate.analysis",
    ),
    **dict.fromkeys(
        (
            "ASGMAccountant",
            "FEASGMAccountant",
            "LastIterateAccountant",
            "public_divisor_of",
            "register_accountant",
            "use_public_divisor",
        ),
        "opacus_lastiterate.accountants",  # torch and opacus
    ),
}

# Subpackages reachable as attributes without an explicit import.
_SUBMODULES = frozenset(
    {"accountants", "analysis", "auditing", "cli", "exceptions", "figures", "schedules"}
)

__all__ = [
    "ASGMAccountant",
    "AuditWarning",
    "DPSGDRun",
    "EpsilonComparison",
    "FEASGMAccountant",
    "HeuristicCalibrationWarning",
    "LastIterateAccountant",
    "LastIterateHeuristic",
    "MonitorWarning",
    "NonMonotoneHeuristicWarning",
    "NonRandomizedInclusionWarning",
    "Normalisation",
    "NormalisationWarning",
    "OneRunDeltaWarning",
    "OpacusLastIterateWarning",
    "OptimizerTraceWarning",
    "RobustLastIterateHeuristic",
    "SamplingWarning",
    "StandardComposition",
    "TrainingSegment",
    "TruncatedRecordWarning",
    "UnsupportedOptimizerError",
    "WeightedAccuracyWarning",
    "ZeroNoiseWarning",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "full_batch_epsilon",
    "heuristic_epsilon",
    "public_divisor_of",
    "register_accountant",
    "standard_epsilon",
    "use_public_divisor",
]


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), _SUBMODULES)

_opacus_hook.install()
