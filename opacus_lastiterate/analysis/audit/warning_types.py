"""Warning classes raised by the audit statistics.

Filter them by class, e.g. ``warnings.simplefilter("error", OneRunDeltaWarning)``.
"""

from __future__ import annotations

__all__ = ["AuditWarning", "NonRandomizedInclusionWarning", "OneRunDeltaWarning"]


class AuditWarning(UserWarning):
    """Base class of every warning about the validity or strength of an audit."""


class OneRunDeltaWarning(AuditWarning):
    """``2 * m * delta`` is not small in a one-run audit (``auditing-anchors.md`` section 2.5).

    The delta term of the one-run p-value is ``2 m delta alpha_delta``; when ``2 m delta``
    approaches 1 the bound collapses. Use fewer canaries or audit at a smaller delta.
    """


class NonRandomizedInclusionWarning(AuditWarning):
    """The canaries of a one-run audit were not included by independent fair coins.

    The one-run theorem (Steinke, Nasr, Jagielski 2023) needs each canary to be included
    independently with probability 1/2; with a fixed in/out split the bound is not valid.
    """
