"""One-run auditing against an f-DP claim (Mahloujifar, Melis, Chaudhuri, "Auditing
f-Differential Privacy in One Run", ICML 2025, arXiv:2410.22235).

Same game as :mod:`.one_run` (m canaries included by independent fair coins, r guesses,
v correct), different analysis: instead of a binomial tail it bounds the probability mass
an f-DP mechanism can put on "v correct out of r" by a recursion over the number of correct
guesses, using the claimed trade-off curve f through g(x) = f(1 - x). With confidence
1 - a (a the significance)::

    r_v = a v / m,   h_v = a (r - v) / m
    for i = v-1, ..., 0:   h_i = max(h_{i+1}, g(r_{i+1}))
                           r_i = min(1, r_{i+1} + i / (r - i) * (h_i - h_{i+1}))
    the claim "f-DP" is rejected iff  r_0 + h_0 > r / m.

(The recursion stops early once h no longer changes.) The bound is the supremum of the
family parameter over the rejected claims. Two families:

- ``"epsilon-delta"``: f = f_{eps, delta} = max(0, 1 - delta - e^eps x, e^-eps (1 - delta - x)),
  the trade-off curve of (eps, delta)-DP itself. Every (eps, delta)-DP mechanism is
  f_{eps, delta}-DP, so the result is an assumption-free LOWER BOUND on epsilon (``kind="bound"``).
  It handles delta through the curve (no ``2 m delta`` term), but it rejects nothing while
  a v / m <= delta (the recursion starts below the delta floor of f): keep delta small
  against the significance per threshold.
- ``"gaussian"``: f = f_mu = Phi(Phi^-1(1 - x) - mu), the claim "mu-GDP" (jax_privacy's
  ``epsilon_one_run_fdp``). The mu is a valid lower bound against "mu-GDP"; its epsilon
  (Dong, Roth, Su Cor. 2.13) is an ESTIMATE: it can exceed the epsilon of a mechanism whose
  trade-off curve is not Gaussian (e.g. randomised response), so it is ``kind="estimate"``,
  exactly like the multi-run Gaussian-DP conversion. It is about twice the (eps, delta)
  one-run bound on Gaussian scores.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Literal

from scipy.special import ndtr, ndtri

from opacus_lastiterate.analysis._bisection import monotone_boundary
from opacus_lastiterate.analysis._validation import check_delta, check_in_interval
from opacus_lastiterate.analysis.audit.one_run import _check_counts, warn_one_run
from opacus_lastiterate.analysis.audit.result import AuditResult, result_kind
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon

__all__ = [
    "one_run_fdp_bound",
]

TradeOffFamily = Literal["epsilon-delta", "gaussian"]
FDP_FAMILIES: tuple[TradeOffFamily, ...] = ("epsilon-delta", "gaussian")

_TOL = 1e-10
_PARAM_MAX = 1e4


def _g_gaussian(mu: float) -> Callable[[float], float]:
    """g(x) = f_mu(1 - x) = Phi(Phi^-1(x) - mu)."""
    return lambda x: float(ndtr(ndtri(x) - mu))


def _g_epsilon_delta(eps: float, delta: float) -> Callable[[float], float]:
    """g(x) = f_{eps,delta}(1 - x) = max(0, e^-eps (x - delta), 1 - delta - e^eps (1 - x))."""
    if eps > 700.0:  # e^eps overflows; g is 0 below x = 1 - tiny, 1 - delta at x = 1
        return lambda x: max(0.0, 1.0 - delta) if x >= 1.0 else 0.0
    a, b = math.exp(-eps), math.exp(eps)
    return lambda x: max(0.0, a * (x - delta), 1.0 - delta - b * (1.0 - x))


def g_function(family: TradeOffFamily, param: float, delta: float) -> Callable[[float], float]:
    """g = f(1 - .) of the family's curve at ``param`` (mu or eps; package-internal)."""
    return _g_gaussian(param) if family == "gaussian" else _g_epsilon_delta(param, delta)


_TIE_SLACK = 16 * sys.float_info.epsilon


def rejects(m: int, r: int, v: int, significance: float, g: Callable[[float], float]) -> bool:
    """True when "v of r guesses correct" rejects the claim with curve g (module docs)."""
    if v == 0 or r == 0:
        return False
    rr = significance * v / m
    h = significance * (r - v) / m
    for i in range(v - 1, -1, -1):
        h_new = max(h, g(rr))
        if h_new == h:
            break
        rr = min(rr + (i / (r - i)) * (h_new - h), 1.0)
        h = h_new
    # rejects only beyond rounding (a few ulp): at an exact tie the recursion's sums may round
    # up past r / m, which would reject a claim the test does not reject (the unsafe side)
    return rr + h > (r / m) * (1.0 + _TIE_SLACK)


def parameter_search(
    m: int,
    r: int,
    v: int,
    significance: float,
    family: TradeOffFamily,
    delta: float,
    floor: float = 0.0,
) -> float:
    """sup of mu (or eps) >= ``floor`` whose claim is rejected (``floor`` if none; internal).

    Bisection keeping rejects(lo) and not rejects(hi); returns ``lo``, never past the supremum.
    """

    def rej(p: float) -> bool:
        return rejects(m, r, v, significance, g_function(family, p, delta))

    if not rej(floor):
        return floor
    # every claim with a large parameter stands: the cap is never reached
    return monotone_boundary(rej, start=floor, rtol=_TOL, cap=_PARAM_MAX)[0]


def check_family(family: object) -> TradeOffFamily:
    if family not in FDP_FAMILIES:
        raise ValueError(f"`family` must be one of {FDP_FAMILIES}, got {family!r}.")
    return family  # type: ignore[return-value]


FDP_GAUSSIAN_NOTE = (
    "f-DP one-run against a Gaussian claim: mu is a valid lower bound against 'mu-GDP'; the "
    "epsilon assumes a Gaussian trade-off curve and can exceed the true epsilon otherwise."
)


def fdp_result(
    value: float, family: TradeOffFamily, delta: float, confidence: float, **kw: object
) -> AuditResult:
    """The labelled result of an f-DP one-run audit (package-internal)."""
    notes: tuple[str, ...] = tuple(kw.pop("notes", ()))  # type: ignore[arg-type]
    valid = bool(kw.get("statistically_valid", True))
    if family == "gaussian":
        return AuditResult(
            epsilon=gaussian_epsilon(mu=value, delta=delta),
            delta=delta,
            confidence=confidence,
            method="one-run-fdp (gaussian)",
            kind=result_kind("estimate", valid),
            mu=value,
            notes=(FDP_GAUSSIAN_NOTE,) + notes,
            **kw,  # type: ignore[arg-type]
        )
    return AuditResult(
        epsilon=value,
        delta=delta,
        confidence=confidence,
        method="one-run-fdp (epsilon-delta)",
        kind=result_kind("bound", valid),
        notes=notes,
        **kw,  # type: ignore[arg-type]
    )


def one_run_fdp_bound(
    num_canaries: int,
    num_guesses: int,
    num_correct: int,
    *,
    delta: float,
    confidence: float = 0.95,
    family: TradeOffFamily = "epsilon-delta",
    inclusion_randomized: bool = True,
) -> AuditResult:
    """f-DP one-run audit of fixed counts (guessing rule chosen without the coins).

    ``family="epsilon-delta"`` (default): epsilon lower bound (``kind="bound"``).
    ``family="gaussian"``: mu lower bound and its Gaussian-DP epsilon ESTIMATE (as
    jax_privacy's ``epsilon_one_run_fdp``); needs ``delta > 0``.
    """
    counts = _check_counts(num_canaries, num_guesses, num_correct)
    fam = check_family(family)
    if fam == "gaussian":
        d = check_delta(delta)
    else:
        d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    if not isinstance(inclusion_randomized, bool):
        raise TypeError(f"`inclusion_randomized` must be a bool, got {inclusion_randomized!r}.")
    notes = warn_one_run(counts.num_canaries, 0.0, inclusion_randomized)
    value = parameter_search(
        counts.num_canaries, counts.num_guesses, counts.num_correct, 1.0 - c, fam, d
    )
    return fdp_result(
        value,
        fam,
        d,
        c,
        counts=counts,
        selection="guesses fixed without looking at the inclusion coins",
        statistically_valid=inclusion_randomized,
        notes=notes,
    )
