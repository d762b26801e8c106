"""Where a monotone predicate changes: the doubling-then-bisection search shared by the
epsilon and mu searches of the one-run audits and the exact
gradient-space epsilons (each keeps its own predicate, tolerance and side of the answer)."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["monotone_boundary"]


def monotone_boundary(
    holds: Callable[[float], bool], *, start: float = 0.0, rtol: float, cap: float
) -> tuple[float, float]:
    """(lo, hi) with ``holds(lo)`` and not ``holds(hi)``, for a predicate that holds from
    ``start`` (the caller has checked it there) up to some point and fails above it.

    ``hi`` doubles from max(1, 2 start) while the predicate holds, then the interval is
    bisected until hi - lo <= ``rtol`` max(1, lo). ``(lo, inf)`` when it still holds at a
    point above ``cap``: ``lo`` is then the last point where it was seen to hold.
    """
    lo, hi = start, max(1.0, 2.0 * start)
    while holds(hi):
        lo, hi = hi, 2.0 * hi
        if hi > cap:
            return lo, math.inf
    while hi - lo > rtol * max(1.0, lo):
        mid = 0.5 * (lo + hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi
