"""How many more steps certainly keep the last-iterate heuristic within a budget.

A budget guard must know, before each step is applied, whether the heuristic epsilon after
that step exceeds a limit. Computing it every step costs a root find per step; this module
gives a certified shortcut for the constant-rate heuristic (``docs/callbacks.md``, "The
budget guard").

After T steps the pair is P_T = K_T + N(0, s_T^2) against Q_T = N(0, s_T^2), with K_T the
canary count and s_T^2 = sum_t sigma_t^2. After m more steps, at any noise multipliers
sigma > 0 and any sample rates,

* K_{T+m} = K_T + (a count of at most m) is stochastically at most K_T + m, and
* s_{T+m} >= s_T.

Moving mass of the shift law up, and lowering the noise scale (equivalently, scaling every
shift up at a fixed scale), never makes the pair easier to confuse in either direction
(the monotone rounding of :mod:`.incremental_weighted`, item 2). Hence

    eps_{T+j}(delta) <= eps(K_T + m + N(0, s_T^2) || N(0, s_T^2))   for every j <= m,

and the right-hand side is non-decreasing in m. :func:`steps_within_limit` finds the largest
m whose bound is within the limit, by doubling and bisection on m: a few root finds certify
m steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    CountDistribution,
    poisson_binomial_count,
)
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import count_pair

__all__ = []

_MARGIN = 1e-9  # relative: the bound and the checked value each carry the root tolerance


def _count_and_variance(
    history: Sequence[tuple[float, float, int]],
) -> tuple[CountDistribution, float]:
    steps_by_rate: dict[float, int] = {}
    variance = 0.0
    for sigma, q, steps in history:
        steps_by_rate[q] = steps_by_rate.get(q, 0) + steps
        variance += steps * sigma * sigma
    parts = [(n, q) for q, n in sorted(steps_by_rate.items())]
    return poisson_binomial_count(parts), variance


def shifted_count_epsilon(count: CountDistribution, variance: float, shift: int, delta: float) -> float:
    """eps(delta) of the pair (K + shift + N(0, variance), N(0, variance)); ``variance`` > 0."""
    moved = CountDistribution(count.offset + shift, count.log_pmf, count.dropped_mass)
    return count_pair(moved, variance).epsilon(delta)


def steps_within_limit(
    history: Sequence[tuple[float, float, int]],
    delta: float,
    limit: float,
    max_steps: int,
    *,
    start: int = 16,
) -> int:
    """The largest m <= ``max_steps`` such that the constant-rate heuristic epsilon stays
    <= ``limit`` (with a relative margin of 1e-9) after each of the next m steps, whatever
    their noise multipliers (> 0) and sample rates (module docstring); 0 if no step is
    certified. ``history``: the Opacus history ``[(sigma, q, steps), ...]`` so far, all with
    sigma > 0 and at least one step (otherwise 0 is returned). ``start``: the first m tried.
    Inputs are trusted (the caller validates them)."""
    if max_steps < 1 or not history or any(s == 0.0 for s, _, n in history if n):
        return 0
    count, variance = _count_and_variance(history)
    if not variance > 0.0:
        return 0
    bound = limit * (1.0 - _MARGIN)

    def ok(m: int) -> bool:
        eps = shifted_count_epsilon(count, variance, m, delta)
        return math.isfinite(eps) and eps <= bound

    lo, hi = 0, max(1, min(start, max_steps))  # ok(lo) holds (vacuously for 0)
    while ok(hi):  # doubling: find a failing m (or max_steps)
        lo = hi
        if hi == max_steps:
            return hi
        hi = min(2 * hi, max_steps)
    while hi - lo > 1:  # ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
