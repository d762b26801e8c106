"""``warn``: emit a warning attributed to the user's line, not to library internals.

A warning raised by an accountant inside an Opacus optimizer hook has several frames of
opacus_lastiterate, Opacus and torch between it and the user's ``optimizer.step()``; a fixed
``stacklevel`` cannot know how many. :func:`warn` attributes the warning to the first frame
outside the packages of :data:`SKIPPED_PACKAGES` (Python 3.12's ``skip_file_prefixes`` where
available, an equivalent walk of the stack on 3.10 and 3.11).
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

__all__ = ["SKIPPED_PACKAGES", "skipped_prefixes", "warn"]

SKIPPED_PACKAGES: tuple[str, ...] = (
    "opacus_lastiterate",
    "opacus",
    "torch",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "transformers",
    "accelerate",
)
"""Top-level packages whose frames a warning is never attributed to."""

def skipped_prefixes() -> tuple[str, ...]:
    """Directory prefixes (ending in a separator) of the imported :data:`SKIPPED_PACKAGES`.

    A package that is not imported has no frame on the stack, so it is not looked up (and
    not imported).
    """
    prefixes: list[str] = []
    for name in SKIPPED_PACKAGES:
        module = sys.modules.get(name)
        for directory in getattr(module, "__path__", None) or ():
            prefixes.append(os.path.join(os.path.abspath(directory), ""))
    return tuple(prefixes)


def _is_internal(frame: FrameType) -> bool:
    """The import machinery's frames, which ``warnings.warn`` does not count either."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def _next_external(frame: FrameType) -> FrameType | None:
    nxt = frame.f_back
    while nxt is not None and _is_internal(nxt):
        nxt = nxt.f_back
    return nxt


def _external_stacklevel(frame: FrameType, prefixes: tuple[str, ...]) -> int:
    """``stacklevel`` (relative to ``frame``, level 1) of the first frame outside ``prefixes``.

    Counts frames as ``warnings.warn`` does (import-machinery frames are not counted); if
    every frame is inside ``prefixes``, the outermost one.
    """
    level = 1
    while True:
        nxt = _next_external(frame)
        if nxt is None:
            return level
        frame, level = nxt, level + 1
        if not os.path.abspath(frame.f_code.co_filename).startswith(prefixes):
            return level


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` attributed to the first frame outside
    opacus_lastiterate, Opacus, torch, Lightning and Transformers (:data:`SKIPPED_PACKAGES`)."""
    prefixes = skipped_prefixes()
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, stacklevel=2, skip_file_prefixes=prefixes)
    else:  # this function's frame is stacklevel 1 of the warnings.warn call below
        level = _external_stacklevel(sys._getframe(0), prefixes)
        warnings.warn(message, category, stacklevel=level)
