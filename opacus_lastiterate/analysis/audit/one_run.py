"""One-run auditing (Steinke, Nasr, Jagielski, "Privacy auditing with one (1) training run",
NeurIPS 2023, arXiv:2305.08846; ``docs/auditing.md``, "One run").

m canaries are each included by an independent fair coin; after one training run the auditor
guesses on r of them (abstaining on the rest) and v guesses are right. Under the null
"the mechanism is (eps, delta)-DP", with p = e^eps / (1 + e^eps):

    beta    = Pr[Binomial(r, p) >= v]
    alpha   = max_{i = 1..v} (1/i) Pr[v - i <= Binomial(r, p) < v]
    p-value = min(1, beta + 2 m delta alpha)

The p-value increases with eps; the bound is the largest eps whose p-value is still below
the significance 1 - confidence. With v = r and delta = 0 it saturates at
ln(a^(1/r) / (1 - a^(1/r))), a = 1 - confidence. Needs ``2 m delta`` small.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from scipy.stats import binom

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis._bisection import monotone_boundary
from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit.result import AuditResult, OneRunCounts, result_kind
from opacus_lastiterate.exceptions import NonRandomizedInclusionWarning, OneRunDeltaWarning

__all__ = [
    "one_run_epsilon_bound",
]

#: ``2 m delta`` above this triggers :class:`OneRunDeltaWarning` (``docs/auditing.md``, "One run").
ONE_RUN_DELTA_WARNING_LEVEL = 0.1

_EPS_TOL = 1e-10


def p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Unchecked one-run p-value (package-internal); see module docs."""
    if v == 0:
        return 1.0
    p = float(expit(eps))
    beta = float(binom.sf(v - 1, r, p))
    if delta == 0.0 or beta >= 1.0:
        return min(1.0, beta)
    # Pr[v - i <= X < v] for i = 1..v, summed from the top so no cancellation occurs.
    window = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, p))
    alpha = float(np.max(window / np.arange(1, v + 1)))
    return min(1.0, beta + 2.0 * m * delta * alpha)


def epsilon_search(
    m: int, r: int, v: int, significance: float, delta: float, floor: float = 0.0
) -> float:
    """Largest eps >= ``floor`` with p-value < ``significance`` (``floor`` if none; internal).

    Bisection keeping p(lo) < significance <= p(hi); returns ``lo``, so the answer never
    overshoots the true supremum by more than rounding.
    """
    def rejected(eps: float) -> bool:
        return p_value(m, r, v, eps, delta) < significance

    if not rejected(floor):
        return floor
    # p -> 1 as eps -> inf, so the cap is never reached
    return monotone_boundary(rejected, start=floor, rtol=_EPS_TOL, cap=1e6)[0]


def _check_counts(num_canaries: object, num_guesses: object, num_correct: object) -> OneRunCounts:
    m = check_int("num_canaries", num_canaries, minimum=1)
    r = check_int("num_guesses", num_guesses)
    v = check_int("num_correct", num_correct)
    return OneRunCounts(m, r, v)


def warn_one_run(m: int, delta: float, inclusion_randomized: bool) -> list[str]:
    """Emit the one-run warnings; return them as notes for the result (internal)."""
    notes = []
    if not inclusion_randomized:
        msg = (
            "canary inclusion was not randomised by independent fair coins: the one-run bound "
            "is not valid for a fixed in/out split."
        )
        warn(msg, NonRandomizedInclusionWarning)
        notes.append(msg)
    if 2.0 * m * delta > ONE_RUN_DELTA_WARNING_LEVEL:
        msg = (
            f"2 * m * delta = {2.0 * m * delta:.3g} is not small (m = {m}, delta = {delta:g}); "
            "the delta term weakens the one-run bound. Use fewer canaries or a smaller delta."
        )
        warn(msg, OneRunDeltaWarning)
        notes.append(msg)
    return notes


def one_run_epsilon_bound(
    num_canaries: int,
    num_guesses: int,
    num_correct: int,
    *,
    delta: float,
    confidence: float = 0.95,
    inclusion_randomized: bool = True,
) -> AuditResult:
    """One-run epsilon lower bound: the largest eps whose p-value is below 1 - confidence.

    The guessing rule (which canaries, how many) must not depend on the inclusion coins;
    for scores, :func:`~opacus_lastiterate.analysis.audit.audit_one_run` chooses it validly.

    Warns :class:`OneRunDeltaWarning` when ``2 m delta`` > ``ONE_RUN_DELTA_WARNING_LEVEL``
    and :class:`NonRandomizedInclusionWarning` when ``inclusion_randomized`` is False (the
    result is then ``kind="invalid"``).
    """
    counts = _check_counts(num_canaries, num_guesses, num_correct)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    if not isinstance(inclusion_randomized, bool):
        raise TypeError(f"`inclusion_randomized` must be a bool, got {inclusion_randomized!r}.")
    notes = warn_one_run(counts.num_canaries, d, inclusion_randomized)
    eps = epsilon_search(counts.num_canaries, counts.num_guesses, counts.num_correct, 1.0 - c, d)
    return AuditResult(
        epsilon=eps,
        delta=d,
        confidence=c,
        method="one-run",
        kind=result_kind("bound", inclusion_randomized),
        counts=counts,
        selection="guesses fixed without looking at the inclusion coins",
        statistically_valid=inclusion_randomized,
        notes=tuple(notes),
    )
