"""Deprecated: moved to :mod:`opacus_lastiterate.auditing.gradient_space.arithmetic`.

Every name is still found here, with a ``DeprecationWarning`` naming the new path; this
module goes in the next release.
"""

from opacus_lastiterate._lazy import moved_attributes

__getattr__, __dir__ = moved_attributes(__name__, "opacus_lastiterate.auditing.gradient_space.arithmetic", globals())
