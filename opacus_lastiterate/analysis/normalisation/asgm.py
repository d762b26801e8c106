"""ASGM, "batch size revealed" model: DP-SGD that divides by the realised batch size.

Model (``docs/normalisation.md``, "ASGM: dividing by the realised batch size"). The target
record x has clipped gradient of norm C along e, the n other records contribute zero
gradient, each record is in the batch independently with probability q. In units of C the
adversary sees, at every step, the batch size m and the projection y on e:

    without x:  m = K,      y = sigma z            K ~ Binomial(n, q), z ~ N(0, 1)
    with x:     m = K + b,  y = b + sigma z        b ~ Bernoulli(q)

and the privacy loss log(p_with / p_without) is, with r_m = m / (n - m + 1),

    L(m, y) = log(1 - q) + log(1 + r_m exp((2y - 1) / (2 sigma^2)))     0 <= m <= n
    L(n + 1, y) = +inf      (mass q^(n + 1) under "with", none under "without").

This is the d -> infinity limit of (sum + Z) / ``|B|`` (the norm of the noise reveals ``|B|``); for
finite d the released vector is a post-processing of (m, y), so the curve here is an upper
bound for every d, exact for this configuration, and it is what batch-size audits reach. It
is not a worst case over all data sets (same section); label numbers "ASGM (batch size
revealed, other gradients zero)".

Empty batches (m = 0). Opacus 0.9-0.13 crash on an empty batch and the 0.14/0.15 Poisson
sampler silently drops it (``docs/normalisation.md``, "Empty batches"); dividing by 0 would
give NaN.
With m = 0 the canary was not sampled in either world, so whatever the implementation then
does (crash, skip, NaN, divide by 1) reveals at most the event "m = 0", whose loss is
log(1 - q) (the formula at m = 0). The model therefore treats every *drawn* batch as a step
that reveals its size, empty or not: this is exact when the event is visible (a crash, or a
skipped step that shows in the step count) and an upper bound otherwise. ``steps`` must count
drawn batches (sampler iterations), not optimizer steps: in 0.14/0.15 the skipped empties are
missing from ``engine.steps``.

Accounting. Each direction's one-step PLD is built from exact tails (for each m the loss is
increasing in y, so P(L > t) is a sum of normal tails at the inverse), discretised
pessimistically (``discretization_method``), with the +inf mass, and composed T times with
dp_accounting. ``dataset_size = N`` covers both neighbours of a training set of N records:
removing a record (n = N - 1 others) and adding one (n = N others), each in both directions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import NDArray
from scipy import special, stats

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_int,
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
)
from opacus_lastiterate.analysis.normalisation.discretisation import (
    DEFAULT_INTERVAL,
    DiscretizationMethod,
    LossTails,
    WorstOfPLDs,
    check_discretization_method,
    check_interval,
    identity_pld,
    pld_from_tails,
    worst_delta,
    worst_epsilon,
)
from opacus_lastiterate.analysis.run import RunLike, as_run

__all__ = [
    "ASGM",
    "asgm_delta",
    "asgm_epsilon",
    "asgm_pld",
]

ASGM_MODEL = "ASGM (batch size revealed, other gradients zero)"
"""The label to print beside every number computed here."""


_BINOMIAL_TAIL = 1e-20  # batch sizes beyond these binomial tails are sent to +inf
_SQRT_HALF = math.sqrt(0.5)
_CHUNK = 4_000_000  # grid points x batch sizes evaluated at once


def _sf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """Standard normal survival function (erfc is faster than ndtr and as accurate)."""
    return 0.5 * special.erfc(z * _SQRT_HALF)


def _cdf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * special.erfc(-z * _SQRT_HALF)


def _log_expm1(a: NDArray[np.float64]) -> NDArray[np.float64]:
    """log(e^a - 1) for a > 0, stable at both ends."""
    out = np.empty_like(a)
    big = a > 1.0
    out[big] = a[big] + np.log1p(-np.exp(-a[big]))
    out[~big] = np.log(np.expm1(a[~big]))
    return out


def asgm_privacy_loss(
    batch_size: NDArray[np.int64] | int,
    projection: NDArray[np.float64] | float,
    *,
    other_records: int,
    sample_rate: float,
    noise_multiplier: float,
) -> NDArray[np.float64]:
    """L(m, y) = log(1 - q) + log(1 + m / (n - m + 1) exp((2y - 1) / (2 sigma^2))), +inf at
    m = n + 1 (vectorised; the exact log-likelihood ratio "with" over "without")."""
    n, q, s = other_records, sample_rate, noise_multiplier
    m = np.asarray(batch_size, dtype=np.float64)
    y = np.asarray(projection, dtype=np.float64)
    m, y = np.broadcast_arrays(m, y)
    out = np.full(m.shape, math.inf)
    fin = m <= n
    with np.errstate(divide="ignore"):
        log_r = np.log(m[fin]) - np.log(n - m[fin] + 1.0)
    x = log_r + (2.0 * y[fin] - 1.0) / (2.0 * s * s)
    out[fin] = math.log1p(-q) + np.logaddexp(0.0, x) if q < 1 else -math.inf
    return out


def _first(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """Smallest k in [lo, hi] with ``pred(k)`` for a monotone predicate (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class _BatchSizeModel:
    """The weights of the (m, b) components and the tails of L under both hypotheses."""

    def __init__(self, n: int, q: float, sigma: float) -> None:
        self.n, self.q, self.sigma = n, q, sigma
        self.log1mq = math.log1p(-q)
        with_dist, without_dist = stats.binom(n + 1, q), stats.binom(n, q)
        lo = max(1, _first(lambda k: without_dist.cdf(k) > _BINOMIAL_TAIL, 0, n))
        hi = min(n, _first(lambda k: with_dist.sf(k) <= _BINOMIAL_TAIL, 0, n + 1) + 1)
        m = np.arange(lo, hi + 1, dtype=np.float64)
        pmf = without_dist.pmf
        self.w_with0 = (1.0 - q) * pmf(m)  # b = 0, y ~ N(0, sigma^2)
        self.w_with1 = q * pmf(m - 1.0)  # b = 1, y ~ N(1, sigma^2)
        self.w_without = pmf(m)
        # z-offset: y_m(t) / sigma = a(t) - c_m with c_m = sigma log r_m
        self.c = sigma * (np.log(m) - np.log(n - m + 1.0)) if len(m) else m
        self.atom_with = (1.0 - q) ** (n + 1)  # m = 0, loss log(1 - q)
        self.atom_without = (1.0 - q) ** n
        self.infinite = q ** (n + 1)  # m = n + 1
        if len(m):
            self.cut_with = float(
                with_dist.cdf(lo - 1) - with_dist.pmf(0) + with_dist.sf(hi) - with_dist.pmf(n + 1)
            )
            self.cut_without = float(
                without_dist.cdf(lo - 1) - without_dist.pmf(0) + without_dist.sf(hi)
            )
        else:
            self.cut_with = self.cut_without = 0.0
        self.cut_with = max(self.cut_with, 0.0)
        self.cut_without = max(self.cut_without, 0.0)

    def _a(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        """a(t) with L(m, y) > t  <=>  y / sigma > a(t) - c_m  (for t > log(1 - q))."""
        s = self.sigma
        return 0.5 / s + s * _log_expm1(t - self.log1mq)

    def _sums(self, t: NDArray[np.float64], upper: bool) -> tuple[NDArray, NDArray]:
        """(with, without) masses of {L > t} (upper) or {L < t} (not upper), pieces 1..n."""
        with_mass = np.zeros_like(t)
        without_mass = np.zeros_like(t)
        above = t > self.log1mq
        if not len(self.c):
            return with_mass, without_mass
        if upper:  # below log(1 - q) every piece is in {L > t}
            with_mass[~above] = self.w_with0.sum() + self.w_with1.sum()
            without_mass[~above] = self.w_without.sum()
        idx = np.flatnonzero(above)
        rows = max(1, _CHUNK // len(self.c))
        tail = _sf if upper else _cdf
        inv_s = 1.0 / self.sigma
        for start in range(0, len(idx), rows):
            sel = idx[start : start + rows]
            z0 = self._a(t[sel])[:, None] - self.c[None, :]
            p0 = tail(z0)
            p1 = tail(z0 - inv_s)
            with_mass[sel] = p0 @ self.w_with0 + p1 @ self.w_with1
            without_mass[sel] = p0 @ self.w_without
        return with_mass, without_mass

    def remove_tails(self) -> LossTails:
        """Upper = with x; L as above."""

        def tails(t: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            w, wo = self._sums(t, upper=True)
            below = t < self.log1mq
            return (
                w + below * self.atom_with + self.infinite + self.cut_with,
                wo + below * self.atom_without,
            )

        finite_max = math.inf if len(self.c) else self.log1mq
        return LossTails(tails, self.infinite + self.cut_with, self.log1mq, finite_max)

    def add_tails(self) -> LossTails:
        """Upper = without x; the loss is -L, so P(-L > t) = P(L < -t)."""

        def tails(t: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            w, wo = self._sums(-t, upper=False)
            above = -t > self.log1mq
            return wo + above * self.atom_without + self.cut_without, w + above * self.atom_with

        finite_min = -math.inf if len(self.c) else -self.log1mq
        return LossTails(tails, self.cut_without, finite_min, -self.log1mq)


def _check_common(
    sample_rate: object,
    noise_multiplier: object,
    steps: object,
    interval: object,
    discretization_method: object,
) -> tuple[float, float, int, float, DiscretizationMethod]:
    return (
        check_sample_rate(sample_rate),
        check_noise_multiplier(noise_multiplier),
        check_steps(steps),
        check_interval(interval),
        check_discretization_method(discretization_method),
    )


def asgm_pld(
    *,
    other_records: int,
    sample_rate: float,
    noise_multiplier: float,
    steps: int = 1,
    value_discretization_interval: float = DEFAULT_INTERVAL,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> PrivacyLossDistribution:
    """PLD of T steps of the ASGM model for one pair: n = ``other_records`` others, with or
    without the target (remove: upper = with, add: upper = without), pessimistic."""
    n = check_int("other_records", other_records, minimum=0)
    q, s, t, interval, disc = _check_common(
        sample_rate, noise_multiplier, steps, value_discretization_interval, discretization_method
    )
    if t == 0:
        return identity_pld(interval)
    if q == 1.0:  # the batch is everything: its size is the data set size
        return _certain_pld(interval)
    model = _BatchSizeModel(n, q, s)
    one = pld_from_tails(
        model.remove_tails(), model.add_tails(), interval=interval, discretization_method=disc
    )
    return one if t == 1 else one.self_compose(t)


def _neighbour_plds(
    dataset_size: object, q: float, sigma: float, steps: int, interval: float,
    method: DiscretizationMethod,
) -> list[PrivacyLossDistribution]:
    """:func:`asgm_pld` of both neighbours of an N-record data set."""
    n = check_int("dataset_size", dataset_size, minimum=1)
    return [
        asgm_pld(other_records=others, sample_rate=q, noise_multiplier=sigma, steps=steps,
                 value_discretization_interval=interval, discretization_method=method)
        for others in (n - 1, n)
    ]


def asgm_epsilon(
    delta: float,
    *,
    dataset_size: int,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    value_discretization_interval: float = DEFAULT_INTERVAL,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> float:
    """Smallest epsilon with delta(epsilon) <= ``delta`` for T steps of the ASGM model, worst
    of both neighbours of an N-record data set and both directions (an upper bound; inf when
    the all-sampled mass already exceeds delta)."""
    d = check_delta(delta)
    plds = _neighbour_plds(dataset_size, sample_rate, noise_multiplier, steps,
                           value_discretization_interval, discretization_method)
    return worst_epsilon(plds, d)


def asgm_delta(
    epsilon: float,
    *,
    dataset_size: int,
    sample_rate: float,
    noise_multiplier: float,
    steps: int,
    value_discretization_interval: float = DEFAULT_INTERVAL,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> float:
    """delta(epsilon) for T steps of the ASGM model, worst of both neighbours of an N-record
    data set and both directions (an upper bound)."""
    e = check_epsilon(epsilon)
    plds = _neighbour_plds(dataset_size, sample_rate, noise_multiplier, steps,
                           value_discretization_interval, discretization_method)
    return worst_delta(plds, e)


_TAIL_TRUNCATION = 1e-15
"""dp_accounting's ``PrivacyLossDistribution.compose`` truncates tails of this mass."""


def _finite_mass(pld: PrivacyLossDistribution) -> float:
    """The smaller finite mass of the PLD's two directions (1 - its infinite-loss mass)."""
    return max(0.0, 1.0 - float(pld.get_delta_for_epsilon(math.inf)))


def _certain_pld(interval: float) -> PrivacyLossDistribution:
    """An infinite privacy loss with probability 1 (epsilon = inf, delta = 1)."""
    certain = pld_pmf.create_pmf({0: 0.0}, interval, 1.0, pessimistic_estimate=True)
    return PrivacyLossDistribution(certain, certain)


class ASGM(WorstOfPLDs):
    """Division by the realised batch size (Opacus 0.x) for a run: the exact "batch size
    revealed" model (:data:`ASGM_MODEL`), worst of both neighbours of the N-record data set
    (``run.normalisation.dataset_size``) and both directions, composed segment by segment.
    An upper bound on that model; a step without noise gives epsilon = inf, delta = 1."""

    kind = "upper_bound"
    label = ASGM_MODEL

    def __init__(
        self,
        run: RunLike,
        *,
        value_discretization_interval: float = DEFAULT_INTERVAL,
        discretization_method: DiscretizationMethod = "connect_dots",
    ) -> None:
        self.run = as_run(run)
        norm = self.run.normalisation
        if norm is None or norm.dataset_size is None:
            raise ValueError(
                "`run.normalisation.dataset_size` must be given for the ASGM model: "
                "DPSGDRun.from_history(..., normalisation=Normalisation('realised', dataset_size=N))."
            )
        self.dataset_size = norm.dataset_size
        self.interval = check_interval(value_discretization_interval)
        self.discretization_method = check_discretization_method(discretization_method)
        self._plds: list[PrivacyLossDistribution] | None = None

    def _composed(self) -> list[PrivacyLossDistribution]:
        if self._plds is None:
            out = []
            for others in (self.dataset_size - 1, self.dataset_size):
                plds = [
                    asgm_pld(
                        other_records=others,
                        sample_rate=s.sample_rate,
                        noise_multiplier=s.noise_multiplier,
                        steps=s.steps,
                        value_discretization_interval=self.interval,
                        discretization_method=self.discretization_method,
                    )
                    for s in self.run.segments
                ]
                composed = plds[0]
                for pld in plds[1:]:
                    # A step with q = 1, or with q near 1 composed many times, leaves (almost)
                    # no finite loss: the batch size reveals the target. When the composition
                    # would keep at most the tail that dp_accounting truncates, it has no finite
                    # part left (and dp_accounting fails on it): an infinite loss with
                    # probability >= 1 - 1e-15, pessimistically 1.
                    if _finite_mass(composed) * _finite_mass(pld) <= _TAIL_TRUNCATION:
                        composed = _certain_pld(self.interval)
                        break
                    composed = composed.compose(pld)
                out.append(composed)
            self._plds = out
        return self._plds

    def __repr__(self) -> str:
        return f"ASGM(steps={self.run.num_steps}, dataset_size={self.dataset_size})"
