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
* **What a user imports.** The root names (``__all__``, each listed once, in ``_LAZY``) are
  the accountants for ``PrivacyEngine``, the description of a run and the function that
  builds each of its numbers (``privacy_model``), the batch schemes and the balls-in-bins
  sampler, the privacy monitor with its budget, sinks and in-training audit, the audit
  statistics (``ScoreAudit``) and the package's warning base class; everything else is
  imported from its subpackage (``docs/api/index.md``). They resolve on first access (PEP 562
  module ``__getattr__``): ``opacus_lastiterate.LastIterateAccountant`` imports the
  accountants (and so torch and Opacus) only then, the analysis names only the mathematics.
  ``__init__.pyi`` gives type checkers the same names.
"""

from __future__ import annotations

from opacus_lastiterate import _opacus_hook
from opacus_lastiterate._lazy import lazy_attributes
from opacus_lastiterate.exceptions import OpacusLastIterateWarning

__version__ = "0.1.0"

# The public names resolved lazily -> the module that exports them.
_LAZY: dict[str, str] = {
    # accountants for PrivacyEngine(accountant=...) (torch and Opacus)
    "LastIterateAccountant": "opacus_lastiterate.accountants",
    "FEASGMAccountant": "opacus_lastiterate.accountants",
    "ASGMAccountant": "opacus_lastiterate.accountants",
    "use_public_divisor": "opacus_lastiterate.accountants",
    # a run and its numbers (no torch)
    "DPSGDRun": "opacus_lastiterate.analysis",
    "privacy_model": "opacus_lastiterate.analysis.privacy_models",
    "compare_epsilons": "opacus_lastiterate.analysis",
    "standard_epsilon": "opacus_lastiterate.analysis",
    "calibrate_noise_multiplier": "opacus_lastiterate.analysis",
    # how the batches are drawn
    "PoissonSampling": "opacus_lastiterate.analysis",
    "ShuffledBatches": "opacus_lastiterate.analysis",
    "DeterministicBatches": "opacus_lastiterate.analysis",
    "BallsInBins": "opacus_lastiterate.analysis",
    "balls_in_bins_data_loader": "opacus_lastiterate.samplers",
    # the privacy monitor of a training loop
    "PrivacyMonitor": "opacus_lastiterate.callbacks",
    "PrivacyBudget": "opacus_lastiterate.callbacks",
    "JsonlSink": "opacus_lastiterate.callbacks",
    "CsvSink": "opacus_lastiterate.callbacks",
    "LoggingSink": "opacus_lastiterate.callbacks",
    "InTrainingCanaryAudit": "opacus_lastiterate.callbacks",
    # audit statistics
    "ScoreAudit": "opacus_lastiterate.analysis.audit",
}

# Subpackages reachable as attributes without an explicit import.
_SUBMODULES = frozenset(
    {"accountants", "analysis", "auditing", "callbacks", "cli", "exceptions", "figures",
     "samplers", "schedules"}
)

__all__ = ["OpacusLastIterateWarning", *_LAZY]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals(), _SUBMODULES)

_opacus_hook.install()
