"""Warnings and errors of opacus-lastiterate, in one torch-free module (numpy's convention).

Every warning the package emits derives from :class:`OpacusLastIterateWarning` (a
``UserWarning``), so all of them can be filtered at once::

    import warnings
    from opacus_lastiterate.exceptions import OpacusLastIterateWarning

    warnings.simplefilter("error", OpacusLastIterateWarning)   # or "ignore"

or one by one (``warnings.simplefilter("ignore", HeuristicCalibrationWarning)``). The classes
are also importable from the package root. Importing this module loads neither torch nor
opacus.
"""

from __future__ import annotations

__all__ = [
    "AdaptiveHeuristicWarning",
    "AuditWarning",
    "HeuristicCalibrationWarning",
    "MonitorWarning",
    "NonMonotoneHeuristicWarning",
    "NonRandomizedInclusionWarning",
    "NormalisationWarning",
    "OneRunDeltaWarning",
    "OpacusLastIterateWarning",
    "OptimizerTraceWarning",
    "PrivacyBudgetExceededError",
    "PrivacyWiringError",
    "SamplingWarning",
    "TruncatedRecordWarning",
    "UnsupportedOptimizerError",
    "WeightedAccuracyWarning",
    "ZeroNoiseWarning",
]


class OpacusLastIterateWarning(UserWarning):
    """Base class of every warning emitted by opacus-lastiterate."""


# -- accountants ------------------------------------------------------------------------------


class HeuristicCalibrationWarning(OpacusLastIterateWarning):
    """Noise is being calibrated to the last-iterate heuristic, which is not a DP guarantee.

    Emitted when a ``LastIterateAccountant`` evaluates a history that was assigned directly
    (``accountant.history = [...]``), which is what Opacus's ``get_noise_multiplier`` (and so
    ``PrivacyEngine.make_private_with_epsilon``) does.
    """


class NonMonotoneHeuristicWarning(OpacusLastIterateWarning):
    """eps_T < max_{t<=T} eps_t: a regulariser that zeroes the model would expose more.

    Report ``get_epsilon(delta, robust=True)`` beside the plain value (``docs/last_iterate.md``).
    """


class OptimizerTraceWarning(OpacusLastIterateWarning):
    """The optimizer's settings cannot be turned into per-step weights (adaptive optimizer,
    or parameter groups with different settings): the constant-rate formula is used."""


class AdaptiveHeuristicWarning(OpacusLastIterateWarning):
    """A run of an adaptive optimizer (Adam, AdamW, ...) lies outside the settings where the
    frozen-second-moment heuristic was checked against simulation
    (``docs/adaptive_optimizers.md``): its number is unchecked there. Given once per run."""


class NormalisationWarning(OpacusLastIterateWarning):
    """The recorded training does not match the model a normalisation accountant computes."""


class SamplingWarning(OpacusLastIterateWarning):
    """The run's batches are drawn by a sampler whose privacy the package cannot model, or
    by one the accountant in use does not account (Opacus's accountants assume Poisson
    sampling): the numbers say what they assume (``docs/samplers.md``)."""


class ZeroNoiseWarning(OpacusLastIterateWarning):
    """A step with ``noise_multiplier=0`` was recorded: epsilon is infinite from then on."""


# -- callbacks --------------------------------------------------------------------------------


class MonitorWarning(OpacusLastIterateWarning):
    """A :class:`~opacus_lastiterate.callbacks.PrivacyMonitor` changed how it works to keep
    training going, e.g. its evaluation process failed and it evaluates inline from then on."""


# -- analysis ---------------------------------------------------------------------------------


class WeightedAccuracyWarning(OpacusLastIterateWarning, RuntimeWarning):
    """The weighted heuristic could not reach the requested accuracy within the grid-size
    limit; the value returned is still an upper bound. (Also a ``RuntimeWarning``, as before.)"""


# -- auditing ---------------------------------------------------------------------------------


class AuditWarning(OpacusLastIterateWarning):
    """Base class of every warning about the validity or strength of an audit."""


class OneRunDeltaWarning(AuditWarning):
    """``2 * m * delta`` is not small in a one-run audit.

    The delta term of the one-run p-value is ``2 m delta alpha_delta``; when ``2 m delta``
    approaches 1 the bound collapses. Use fewer canaries or audit at a smaller delta.
    """


class NonRandomizedInclusionWarning(AuditWarning):
    """The canaries of a one-run audit were not included by independent fair coins.

    The one-run theorem (Steinke, Nasr, Jagielski 2023) needs each canary to be included
    independently with probability 1/2; with a fixed in/out split the bound is not valid.
    """


class TruncatedRecordWarning(OpacusLastIterateWarning):
    """A record file ended in a partial line (a run killed while writing); it was dropped."""


# -- errors -----------------------------------------------------------------------------------


class UnsupportedOptimizerError(ValueError):
    """The optimiser is not linear in the noisy gradient; the weighted heuristic does not apply.

    A ``ValueError``, so ``except ValueError`` keeps catching it.
    """


class PrivacyBudgetExceededError(RuntimeError):
    """The next optimizer step would push the monitored epsilon past the budget.

    Raised by :class:`~opacus_lastiterate.callbacks.PrivacyMonitor` (``action="raise"``)
    from ``optimizer.step()`` *before* the parameters are updated: the model and the
    accountant are left as they were after the last allowed step. Attributes: ``step`` (the
    refused step's number), ``metric``, ``value`` (epsilon it would have reached), ``limit``.
    """

    def __init__(self, message: str, *, step: int, metric: str, value: float, limit: float):
        super().__init__(message)
        self.step, self.metric, self.value, self.limit = step, metric, value, limit


class PrivacyWiringError(ValueError):
    """Parameters that the Opacus set-up does not privatise (the wiring check,
    :func:`~opacus_lastiterate.auditing.check_private_training`).

    Attribute ``problems``: parameter name -> what is wrong with it. The message lists them.
    A ``ValueError``, so ``except ValueError`` keeps catching it.
    """

    def __init__(self, problems: dict[str, str]):
        self.problems = dict(problems)
        lines = "\n".join(f"  {name}: {why}" for name, why in self.problems.items())
        super().__init__(
            f"{len(self.problems)} parameter(s) not privatised as stated by the DP optimizer:\n"
            f"{lines}"
        )
