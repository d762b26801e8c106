"""Exact dimension-aware privacy curve of (sum + Z) / c with a data-dependent divisor c.

Zero-other-gradients configuration of ``docs/normalisation.md``, "FEASGM / EASGM with a
data-dependent divisor": units of C, target direction e, the other records contribute zero
gradient, c1 = divisor without the target, c2 = divisor with it, q = the target's sampling
rate in the world with it, d = number of parameters, Z ~ N(0, sigma^2 I_d):

    without: O = Z / c1            with: O = (b e + Z) / c2,  b ~ Bernoulli(q)

u = <O, e> and v = ||O - u e||^2 are sufficient and independent under both hypotheses, and ::

    log(p_with / p_without) = A(u) + B(v)
    A(u) = log(c2/c1) + u^2 (c1^2 - c2^2) / (2 sigma^2)
           + log[(1 - q) + q exp((2 u c2 - 1) / (2 sigma^2))]
    B(v) = (d - 1) log(c2/c1) - v (c2^2 - c1^2) / (2 sigma^2)

with u ~ N(0, sigma^2/c1^2) and v ~ (sigma^2/c1^2) chi2_{d-1} without the target,
u ~ (1 - q) N(0, sigma^2/c2^2) + q N(1/c2, sigma^2/c2^2) and v ~ (sigma^2/c2^2) chi2_{d-1}
with it. One step's PLD is therefore the composition of the PLDs of A and of B (each a
one-dimensional pair, discretised pessimistically from exact tails: A has at most four
monotone pieces, found from its critical points and inverted by bisection; B is linear in a
chi-square variable). T steps are composed with dp_accounting, both directions. The number
of steps is assumed to be the same T in both worlds (training by steps, not epochs).

For c1 = c2 the curve is SGM's. For c1 != c2 it is the curve that audits reach in this
configuration, a *lower* bound on the worst case (which is epsilon = inf, see
:mod:`divisor_verdict`). Label numbers "FEASGM (zero other gradients, d = ...)".
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import NDArray
from scipy import optimize, special

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_int,
    check_noise_multiplier,
    check_positive,
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
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
    opacus1x_batch_arithmetic,
)
from opacus_lastiterate.analysis.run import RunLike, as_run

__all__ = [
    "FEASGM",
    "divisor_leak_pld",
    "feasgm_delta",
    "feasgm_epsilon",
]

FEASGM_MODEL = "FEASGM (Opacus 1.x divisor, zero other gradients, d = {dimension})"
"""Label template for numbers computed here (format with ``dimension=d``)."""

_SQRT_HALF = math.sqrt(0.5)
_BISECTIONS = 64
_AUTO_POINTS = 200_000  # auto interval: about this many grid points across sqrt(T) sds


def _sf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * special.erfc(z * _SQRT_HALF)


def _cdf(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return 0.5 * special.erfc(-z * _SQRT_HALF)


def divisor_leak_loss(
    projection: NDArray[np.float64] | float,
    residual_norm_sq: NDArray[np.float64] | float,
    *,
    divisor_without: float,
    divisor_with: float,
    sample_rate: float,
    noise_multiplier: float,
    dimension: int,
) -> NDArray[np.float64]:
    """A(u) + B(v) of the module docstring: the exact log(p_with / p_without) at (u, v)."""
    c1, c2, q, s = divisor_without, divisor_with, sample_rate, noise_multiplier
    u = np.asarray(projection, dtype=np.float64)
    v = np.asarray(residual_norm_sq, dtype=np.float64)
    return (
        _a_loss(u, c1, c2, q, s)
        + (dimension - 1) * math.log(c2 / c1)
        - v * (c2 * c2 - c1 * c1) / (2 * s * s)
    )


def _a_loss(u: NDArray[np.float64], c1: float, c2: float, q: float, s: float) -> NDArray:
    mix = np.logaddexp(
        math.log1p(-q) if q < 1 else -math.inf, math.log(q) + (2 * u * c2 - 1) / (2 * s * s)
    )
    return math.log(c2 / c1) + u * u * (c1 * c1 - c2 * c2) / (2 * s * s) + mix


class _ProjectionPart:
    """The pair of u-marginals and its loss A(u), split into monotone pieces."""

    def __init__(self, c1: float, c2: float, q: float, sigma: float) -> None:
        self.c1, self.c2, self.q, self.sigma = c1, c2, q, sigma
        self.s_with, self.s_without = sigma / c2, sigma / c1
        self.with_parts = [(w, mu) for w, mu in ((1 - q, 0.0), (q, 1 / c2)) if w > 0]
        self.without_parts = [(1.0, 0.0)]
        bound = 80.0 * max(self.s_with, self.s_without) + 2.0 / c2
        cuts = [-bound, *self._critical_points(), bound]
        self.pieces = []
        for a, b in itertools.pairwise(cuts):
            la, lb = self.loss(np.array([a, b]))
            self.pieces.append((a, b, bool(lb >= la)))

    def loss(self, u: NDArray[np.float64]) -> NDArray[np.float64]:
        return _a_loss(u, self.c1, self.c2, self.q, self.sigma)

    def _critical_points(self) -> list[float]:
        """Roots of A'(u) sigma^2 = u (c1^2 - c2^2) + c2 w(u), w the posterior of b = 1."""
        c1, c2, q, s = self.c1, self.c2, self.q, self.sigma
        if c1 == c2:
            return []  # A is increasing
        logit = math.inf if q == 1 else math.log(q) - math.log1p(-q)

        def slope(u: NDArray[np.float64] | float) -> NDArray[np.float64]:
            w = special.expit(logit + (2 * np.asarray(u) * c2 - 1) / (2 * s * s))
            return np.asarray(u) * (c1 * c1 - c2 * c2) + c2 * w

        end = c2 / (c2 * c2 - c1 * c1)  # every root lies between 0 and this
        grid = np.linspace(min(0.0, end), max(0.0, end), 20_001)
        pad = 1e-9 * (abs(end) + 1)
        grid[0] -= pad
        grid[-1] += pad
        f = slope(grid)
        roots = []
        for i in np.flatnonzero(np.sign(f[:-1]) * np.sign(f[1:]) < 0):
            roots.append(float(optimize.brentq(slope, grid[i], grid[i + 1], xtol=1e-15)))
        return roots

    def _root(self, t: NDArray[np.float64], a: float, b: float, up: bool) -> NDArray:
        """x with A(x) = t on the monotone piece [a, b] (clamped to the piece)."""
        lo = np.full_like(t, a)
        hi = np.full_like(t, b)
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            above = self.loss(mid) > t
            if up:
                hi = np.where(above, mid, hi)
                lo = np.where(above, lo, mid)
            else:
                lo = np.where(above, mid, lo)
                hi = np.where(above, hi, mid)
        la, lb = self.loss(np.array([a, b]))
        if up:
            return np.where(la > t, a, np.where(lb <= t, b, hi))
        return np.where(lb > t, b, np.where(la <= t, a, lo))

    @staticmethod
    def _mass(lo: NDArray, hi: NDArray, parts: list[tuple[float, float]], s: float) -> NDArray:
        total = np.zeros_like(lo)
        for w, mu in parts:
            za, zb = (lo - mu) / s, (hi - mu) / s
            p = np.where(za > 0, _sf(za) - _sf(zb), _cdf(zb) - _cdf(za))
            total += w * np.maximum(p, 0.0)
        return total

    def _tails(self, t: NDArray[np.float64], greater: bool) -> tuple[NDArray, NDArray]:
        """(with, without) masses of {A > t} (greater) or {A < t}."""
        w = np.zeros_like(t)
        wo = np.zeros_like(t)
        first, last = self.pieces[0][0], self.pieces[-1][1]
        for a, b, up in self.pieces:
            x = self._root(t, a, b, up)
            if up == greater:  # the set is [x, b]
                lo, hi = x, np.full_like(t, b)
            else:  # the set is [a, x]
                lo, hi = np.full_like(t, a), x
            lo = np.where(lo == first, -np.inf, lo)
            hi = np.where(hi == last, np.inf, hi)
            w += self._mass(lo, hi, self.with_parts, self.s_with)
            wo += self._mass(lo, hi, self.without_parts, self.s_without)
        return w, wo

    def remove_tails(self) -> LossTails:
        return LossTails(lambda t: self._tails(t, greater=True))

    def add_tails(self) -> LossTails:
        def tails(t: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            w, wo = self._tails(-t, greater=False)
            return wo, w

        return LossTails(tails)


class _NormPart:
    """The pair of v-marginals: B = k log(c2/c1) - X beta, X ~ chi2_k, k = d - 1, with
    beta = (1 - c1^2/c2^2)/2 with the target and (c2^2/c1^2 - 1)/2 without it."""

    def __init__(self, c1: float, c2: float, k: int) -> None:
        self.k, self.top = k, k * math.log(c2 / c1)  # B at X = 0
        self.beta_with = 0.5 * (1 - (c1 / c2) ** 2)
        self.beta_without = 0.5 * ((c2 / c1) ** 2 - 1)
        self.increasing_in_x = c2 < c1

    def _greater(self, t: NDArray[np.float64], beta: float) -> NDArray[np.float64]:
        """P(B > t) for B = top - X beta."""
        x = np.maximum((self.top - t) / beta, 0.0)  # B > t <=> X < x (beta > 0) or X > x
        if beta > 0:
            return special.gammainc(self.k / 2, x / 2)
        return special.gammaincc(self.k / 2, x / 2)

    def _less(self, t: NDArray[np.float64], beta: float) -> NDArray[np.float64]:
        x = np.maximum((self.top - t) / beta, 0.0)
        if beta > 0:
            return special.gammaincc(self.k / 2, x / 2)
        return special.gammainc(self.k / 2, x / 2)

    def remove_tails(self) -> LossTails:
        def tails(t: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            return self._greater(t, self.beta_with), self._greater(t, self.beta_without)

        if self.increasing_in_x:
            return LossTails(tails, loss_min=self.top)
        return LossTails(tails, loss_max=self.top)

    def add_tails(self) -> LossTails:
        def tails(t: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
            return self._less(-t, self.beta_without), self._less(-t, self.beta_with)

        if self.increasing_in_x:
            return LossTails(tails, loss_max=-self.top)
        return LossTails(tails, loss_min=-self.top)

    def spread(self) -> float:
        """Standard deviation of B under the target-included hypothesis."""
        return abs(self.beta_with) * math.sqrt(2.0 * self.k)


def divisor_leak_pld(
    *,
    divisor_without: float,
    divisor_with: float,
    sample_rate: float,
    noise_multiplier: float,
    dimension: int,
    steps: int = 1,
    value_discretization_interval: float | None = None,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> PrivacyLossDistribution:
    """PLD of T steps of (sum + Z) / c in the zero-other-gradients configuration (module
    docstring), remove (upper = with the target) and add directions, pessimistic.

    ``value_discretization_interval=None`` picks max(3e-4, sqrt(T) * sd(B) / 200,000), so
    that very large d (where B spans hundreds of nats per step) stays computable.
    """
    c1 = check_positive("divisor_without", divisor_without)
    c2 = check_positive("divisor_with", divisor_with)
    q = check_sample_rate(sample_rate)
    s = check_noise_multiplier(noise_multiplier)
    d = check_int("dimension", dimension, minimum=1)
    t = check_steps(steps)
    disc = check_discretization_method(discretization_method)
    norm = _NormPart(c1, c2, d - 1) if (d > 1 and c1 != c2) else None
    if value_discretization_interval is None:
        spread = norm.spread() * math.sqrt(max(t, 1)) if norm else 0.0
        interval = max(DEFAULT_INTERVAL, spread / _AUTO_POINTS)
    else:
        interval = check_interval(value_discretization_interval)
    if t == 0:
        return identity_pld(interval)
    proj = _ProjectionPart(c1, c2, q, s)
    one = pld_from_tails(
        proj.remove_tails(), proj.add_tails(), interval=interval, discretization_method=disc
    )
    if norm is not None:
        one = one.compose(
            pld_from_tails(
                norm.remove_tails(), norm.add_tails(), interval=interval, discretization_method=disc
            )
        )
    return one if t == 1 else one.self_compose(t)


def _feasgm_plds(
    dataset_size: object,
    batch_size: object,
    drop_last: bool,
    kwargs: dict[str, object],
) -> list[PrivacyLossDistribution | None]:
    """PLDs for the pairs (N - 1, N) and (N, N + 1); None where exactly one divisor is 0."""
    n = check_int("dataset_size", dataset_size, minimum=2)
    b = check_int("batch_size", batch_size, minimum=1)
    rows = [opacus1x_batch_arithmetic(m, b, drop_last=drop_last) for m in (n - 1, n, n + 1)]
    out: list[PrivacyLossDistribution | None] = []
    for small, big in itertools.pairwise(rows):
        c1, c2 = small.expected_batch_size, big.expected_batch_size
        if c1 == 0 and c2 == 0:
            out.append(identity_pld(DEFAULT_INTERVAL))  # NaN in both worlds
        elif c1 == 0 or c2 == 0:
            out.append(None)  # finite in one world, inf/NaN in the other
        else:
            out.append(
                divisor_leak_pld(
                    divisor_without=c1,
                    divisor_with=c2,
                    sample_rate=big.sampler_rate,
                    **kwargs,  # type: ignore[arg-type]
                )
            )
    return out


def feasgm_delta(
    epsilon: float,
    *,
    dataset_size: int,
    batch_size: int,
    noise_multiplier: float,
    steps: int,
    dimension: int,
    drop_last: bool = False,
    value_discretization_interval: float | None = None,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> float:
    """delta(epsilon) of T steps of Opacus 1.x's FEASGM in the zero-other-gradients
    configuration with d = ``dimension``, worst of the pairs (N-1, N), (N, N+1) and both
    directions. Equal to SGM's when the verdict is safe; a lower bound on the worst case
    (which is 1) when unsafe."""
    e = check_epsilon(epsilon)
    plds = _feasgm_plds(dataset_size, batch_size, drop_last, dict(
        noise_multiplier=noise_multiplier, dimension=dimension, steps=steps,
        value_discretization_interval=value_discretization_interval,
        discretization_method=discretization_method))
    return worst_delta(plds, e)


def feasgm_epsilon(
    delta: float,
    *,
    dataset_size: int,
    batch_size: int,
    noise_multiplier: float,
    steps: int,
    dimension: int,
    drop_last: bool = False,
    value_discretization_interval: float | None = None,
    discretization_method: DiscretizationMethod = "connect_dots",
) -> float:
    """epsilon(delta) for the same model as :func:`feasgm_delta` (inf where a divisor is 0)."""
    dl = check_delta(delta)
    plds = _feasgm_plds(dataset_size, batch_size, drop_last, dict(
        noise_multiplier=noise_multiplier, dimension=dimension, steps=steps,
        value_discretization_interval=value_discretization_interval,
        discretization_method=discretization_method))
    return worst_epsilon(plds, dl)


def _pld_interval(pld: PrivacyLossDistribution) -> float | None:
    value = getattr(getattr(pld, "_pmf_remove", None), "_discretization", None)
    return float(value) if isinstance(value, (int, float)) else None


class FEASGM(WorstOfPLDs):
    """Opacus 1.x's floor-based expected-batch divisor for a run: the dimension-aware curve
    of the zero-other-gradients configuration (:data:`FEASGM_MODEL`), worst of the pairs
    (N-1, N), (N, N+1) and both directions, segment by segment (``docs/normalisation.md``).

    Needs ``run.normalisation`` with ``dataset_size``, ``batch_size`` and ``dimension`` (and
    ``drop_last``); with rule ``"public"`` the divisor is ``public_divisor`` in both worlds
    while Opacus's sample rate 1/len(DataLoader) still changes with N. The sample rate used
    is the sampler's, from Opacus's arithmetic (the recorded rates are not consulted). What
    an audit can reach: a lower bound on the worst case when the verdict is unsafe, SGM's
    curve when it is safe. A step without noise gives epsilon = inf, delta = 1.
    """

    kind = "model"

    def __init__(
        self,
        run: RunLike,
        *,
        value_discretization_interval: float | None = None,
        discretization_method: DiscretizationMethod = "connect_dots",
    ) -> None:
        self.run = as_run(run)
        norm = self.run.normalisation
        missing = [
            name
            for name in ("dataset_size", "batch_size", "dimension")
            if norm is None or getattr(norm, name) is None
        ]
        if missing:
            raise ValueError(
                f"`run.normalisation` must give {', '.join(missing)} for the FEASGM model."
            )
        assert norm is not None
        check_int("dataset_size", norm.dataset_size, minimum=2)
        self.normalisation = norm
        self.interval = (
            None
            if value_discretization_interval is None
            else check_interval(value_discretization_interval)
        )
        self.discretization_method = check_discretization_method(discretization_method)
        self._plds: list[PrivacyLossDistribution | None] | None = None

    @property
    def label(self) -> str:
        """:data:`FEASGM_MODEL` for this d (and the public divisor, if any)."""
        text = FEASGM_MODEL.format(dimension=self.normalisation.dimension)
        if self.normalisation.public_divisor is not None:
            text += f", here with the public divisor {self.normalisation.public_divisor:g}"
        return text

    def _build(self, interval: float | None) -> list[PrivacyLossDistribution | None]:
        norm = self.normalisation
        n, b = int(norm.dataset_size or 0), int(norm.batch_size or 0)
        rows = [opacus1x_batch_arithmetic(m, b, drop_last=norm.drop_last) for m in (n - 1, n, n + 1)]
        public = norm.public_divisor
        out: list[PrivacyLossDistribution | None] = []
        for small, big in itertools.pairwise(rows):
            c1 = public if public is not None else small.expected_batch_size
            c2 = public if public is not None else big.expected_batch_size
            if c1 == 0 and c2 == 0:
                out.append(identity_pld(DEFAULT_INTERVAL))  # NaN in both worlds
                continue
            if c1 == 0 or c2 == 0:
                out.append(None)  # finite in one world, inf/NaN in the other
                continue
            composed: PrivacyLossDistribution | None = None
            for seg in self.run.segments:
                pld = divisor_leak_pld(
                    divisor_without=c1,
                    divisor_with=c2,
                    sample_rate=big.sampler_rate,
                    noise_multiplier=seg.noise_multiplier,
                    dimension=int(norm.dimension or 1),
                    steps=seg.steps,
                    value_discretization_interval=interval,
                    discretization_method=self.discretization_method,
                )
                composed = pld if composed is None else composed.compose(pld)
            out.append(composed)
        return out

    def _composed(self) -> list[PrivacyLossDistribution | None]:
        if self._plds is None:
            plds = self._build(self.interval)
            if self.interval is None and len(self.run.segments) > 1:
                # automatic intervals differ per segment: rebuild them on one common grid
                grids = {_pld_interval(p) for p in plds if p is not None}
                if len(grids) > 1 or None in grids:
                    common = max((g for g in grids if g is not None), default=DEFAULT_INTERVAL)
                    plds = self._build(common)
            self._plds = plds
        return self._plds

    def __repr__(self) -> str:
        return f"FEASGM(steps={self.run.num_steps}, {self.normalisation})"
