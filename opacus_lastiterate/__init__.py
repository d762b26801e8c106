"""opacus-lastiterate: final-model privacy accounting and auditing for DP-SGD.

Importing this package registers its accountants with Opacus, so that
``PrivacyEngine(accountant="last_iterate")`` works (Opacus 1.0 to 1.6).

Importing it also registers ``"asgm"`` and ``"feasgm"`` (batch-size normalisation).

Layout: :mod:`opacus_lastiterate.analysis` is the mathematics (numpy/scipy/dp_accounting,
no torch); :mod:`opacus_lastiterate.accountants` adapts it to Opacus;
:mod:`opacus_lastiterate.auditing` holds the attacks, simulator and many-run runner (torch).
"""

from opacus_lastiterate.analysis import (
    EpsilonComparison,
    TrainingSegment,
    compare_epsilons,
    compare_epsilons_for_history,
    full_batch_epsilon,
    heuristic_delta,
    heuristic_delta_for_history,
    heuristic_epsilon,
    heuristic_epsilon_for_history,
    standard_epsilon,
)

__version__ = "0.1.0"

__all__ = [
    "EpsilonComparison",
    "TrainingSegment",
    "compare_epsilons",
    "compare_epsilons_for_history",
    "full_batch_epsilon",
    "heuristic_delta",
    "heuristic_delta_for_history",
    "heuristic_epsilon",
    "heuristic_epsilon_for_history",
    "standard_epsilon",
]

try:  # the analysis layer works without torch/opacus; the accountants need both
    import opacus as _opacus  # noqa: F401
except ImportError:  # pragma: no cover - opacus is a declared dependency
    pass
else:
    from opacus_lastiterate.accountants import (
        ASGMAccountant,
        FEASGMAccountant,
        HeuristicCalibrationWarning,
        LastIterateAccountant,
        NormalisationWarning,
        public_divisor_of,
        register_accountant,
        use_public_divisor,
    )

    __all__ += [
        "ASGMAccountant",
        "FEASGMAccountant",
        "HeuristicCalibrationWarning",
        "LastIterateAccountant",
        "NormalisationWarning",
        "public_divisor_of",
        "register_accountant",
        "use_public_divisor",
    ]
