"""Both epsilons of the grid-free weighted heuristic from one scan, the roots refined together.

Each epsilon is read at a root in x of a gap function (the stationary point of a hockey-stick
divergence, :mod:`.weighted_fourier`): four of them (two directions, the upper and the lower
bound). The brackets of a scan of x are refined together: a safeguarded Newton step on every
bracket at once (the slope of each gap function is known in closed form from p~ and dp~/dx),
pushed across the root by the size of its last step so that both ends of every bracket
tighten, until the brackets are narrower than ``XTOL`` x s or the epsilons at their two ends
agree to 1e-8 (relative: a hundred-thousandth of the usual ``accuracy``).

Each epsilon is then read at the *safe end* of its bracket, where the sign of the gap has
been evaluated: the upper bound at the end where the approximate divergence (solved against
delta - e) is already <= delta - e, the lower bound where it is still >= delta + e. So the
upper value is an upper bound and the lower value a lower bound on the exact weighted
heuristic whatever the refinement achieved (a bracket left wide only widens the gap between
them, which the caller checks against the requested accuracy).

With L = p~/q (increasing) and Qt the tail of Q:

* P -> Q: g(x) = 1 - F~(x) - L Qt(x) - (delta - sign e), g' = -L Qt (p~'/p~ + (x + mu)/s^2);
  g decreases; epsilon = log L(x);
* Q -> P: g(x) = Q(X <= x) - F~(x)/L - (delta - sign e / L), g' = (F~ - sign e)/L x
  (p~'/p~ + (x + mu)/s^2); g increases; epsilon = -log L(x).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from opacus_lastiterate.analysis.last_iterate.weighted_fourier import Inversion

__all__ = []

XTOL = 1e-10
"""Bracket width, relative to s, below which a root is not refined further (about the
resolution of F~'s rounding there)."""
_ROUNDS = 12
_DEBUG = False
_PUSH = 3.0  # probes at _PUSH x the predicted miss of a Newton step either side of it
_WIDEN = 1000.0  # a round whose two probes fell on one side of the root reaches this much farther
_LTOL = 1e-8  # epsilons at the two ends of a bracket that agree to this (relative) are final
_NEWTON_FLOOR = 1e-3  # a Newton step misses by at least this fraction of its length (rounding of g, g')
Hints = dict[tuple[bool, float], tuple[float, float, float, float]]
"""Per root (direction, sign): its last two positions (uncentred midpoints of the final
brackets) and the widths of those brackets."""
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
_SQRT2 = math.sqrt(2.0)


class _Gaps:
    """The gap functions of both directions at any points, for one inversion."""

    def __init__(self, inv: Inversion, delta: float) -> None:
        self.inv, self.delta = inv, delta
        theta = inv.k * inv.step
        # with E = e^{-i theta x} = cos - i sin: Im(E phi / k) (for F~), Re(E phi) (p~) and
        # Im(E phi theta) (dp~/dx) are cos @ vc + sin @ vs
        phi = inv.phi
        a, b = phi / inv.k, phi * theta
        self.vc = np.stack([a.imag, phi.real, b.imag], axis=1)
        self.vs = np.stack([-a.real, phi.imag, -b.real], axis=1)
        self.theta = theta
        self.c = inv.step / math.pi
        self.log_s = math.log(inv.s) + 0.5 * math.log(2.0 * math.pi)

    def at(
        self, x: list[float], sign: list[float], pq: list[bool]
    ) -> tuple[list[float], list[float], list[float]]:
        """(g, g', log L) of each problem at its point x (pq: the direction P -> Q); the
        Fourier sums in numpy, the rest in Python floats (a few points: cheaper than numpy
        calls; erfcx(y) = exp(y^2) erfc(y) to about y^2 ulps, |y| < 25 on [a, b])."""
        inv = self.inv
        ph = np.multiply.outer(np.asarray(x), self.theta)
        r = (np.cos(ph) @ self.vc + np.sin(ph) @ self.vs).tolist()
        mu, s, floor, err0, delta = inv.mu, inv.s, inv.pdf_floor, inv.error, self.delta
        c, log_s = self.c, self.log_s
        gs, ds, ls = [], [], []
        for xi, sg, is_pq, (f0, p0, d0) in zip(x, sign, pq, r, strict=True):
            cdf, pdf, slope = 0.5 - f0 / math.pi, c * p0, c * d0
            if not pdf > floor:
                gs.append(math.nan)
                ds.append(math.nan)
                ls.append(math.nan)
                continue
            z = (xi + mu) / s
            log_l = math.log(pdf) + 0.5 * z * z + log_s
            dlog = slope / pdf + z / s
            err = sg * err0
            if is_pq:
                y = z / _SQRT2
                erfcx = math.exp(y * y) * math.erfc(y) if y < 25.0 else float(special.erfcx(y))
                tail_q = pdf * s * _SQRT_HALF_PI * erfcx
                gs.append((1.0 - cdf) - tail_q - (delta - err))
                ds.append(-tail_q * dlog)
            else:
                inv_l = math.exp(-log_l)
                gs.append(0.5 * math.erfc(-z / _SQRT2) - cdf * inv_l - (delta - err * inv_l))
                ds.append((cdf - err) * inv_l * dlog)
            ls.append(log_l)
        return gs, ds, ls

    def scan(
        self, x: np.ndarray, cdf: np.ndarray, pdf: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Both gaps at sign 0 (P -> Q, Q -> P), log L and 1/L at the scan points (no
        ``np.errstate`` here: it makes every numpy call inside it several times slower; the
        operations below cannot overflow in [a, b], where L >= p~ floor s sqrt(2 pi) >
        1e-300, and NaN marks p~ below its floor)."""
        inv = self.inv
        z = (x + inv.mu) / inv.s
        solid = pdf > inv.pdf_floor
        safe = np.where(solid, pdf, 1.0)
        log_l = np.log(safe) + (0.5 * z * z + self.log_s)
        log_l[~solid] = np.nan
        inv_l = np.exp(-log_l)
        tail_q = safe * (inv.s * _SQRT_HALF_PI) * special.erfcx(z * (1.0 / _SQRT2))
        g_pq = (1.0 - cdf) - tail_q - self.delta
        g_qp = special.ndtr(z) - cdf * inv_l - self.delta
        return g_pq, g_qp, log_l, inv_l


def _bracket(values: np.ndarray, decreasing: bool) -> int | None:
    """The index i of the scan's single sign change between i and i + 1, or None."""
    ok = np.isfinite(values)
    left = values > 0 if decreasing else values < 0
    idx = np.nonzero(ok[:-1] & ok[1:] & left[:-1] & ~left[1:])[0]
    return int(idx[0]) if idx.size == 1 else None


def solve_epsilons(
    inv: Inversion, delta: float, xs: np.ndarray, cdf: np.ndarray, pdf: np.ndarray,
    hints: Hints | None = None,
) -> tuple[float, float] | None:
    """(upper, lower) epsilon at ``delta`` from the scan (F~, p~) at the points ``xs``, or
    None where the scan does not certify them (module docstring; the same cases as
    :mod:`.weighted_fourier`: no point above the noise floor, a non-increasing likelihood
    ratio, no single crossing). ``hints``: a dict kept by the caller between queries of a
    growing run, holding each root's last two positions (uncentred); a root predicted from
    them inside its scan bracket starts the refinement there (the result does not depend on
    the hints beyond the last bits: each bracket is verified as without them)."""
    gaps = _Gaps(inv, delta)
    # both directions at sign 0; sign +-1 shifts them by -+ e (P -> Q) and -+ e / L (Q -> P)
    g_pq, g_qp, log_l, inv_l = gaps.scan(xs, cdf, pdf)
    finite = np.isfinite(log_l)
    if not finite.any() or np.any(np.diff(log_l[finite]) <= 0):
        return None
    found: dict[float, list[float]] = {1.0: [], -1.0: []}
    # (P -> Q, sign, the bracket's ends, the gap and log L there, from the scan)
    problems: list[tuple[bool, float, float, float, float, float, float, float]] = []
    n = xs.size
    above = finite & (log_l >= 0.0)
    below = finite & (log_l <= 0.0)
    first = int(np.argmax(above)) if above.any() else -1
    if below.any():
        last = n - int(np.argmax(below[::-1]))
        lo = int(np.argmax(below))
    for sign in (1.0, -1.0):
        if first >= 0:
            g1 = g_pq[first:] + sign * inv.error
            if g1[0] <= 0:  # below delta already at the first point with L >= 1
                found[sign].append(float(log_l[first]) if sign > 0 else 0.0)
            else:
                i = _bracket(g1, True)
                if i is None:
                    return None
                j = first + i
                problems.append((True, sign, xs[j], xs[j + 1], g1[i], g1[i + 1], log_l[j],
                                 log_l[j + 1]))  # fmt: skip
        if below.any():
            g2 = g_qp[lo:last] + sign * inv.error * inv_l[lo:last]
            if g2[-1] <= 0:  # below delta already at the last point with L <= 1
                found[sign].append(-float(log_l[last - 1]) if sign > 0 else 0.0)
            else:
                i = _bracket(g2, False)
                if i is None:
                    return None
                j = lo + i
                problems.append((False, sign, xs[j], xs[j + 1], g2[i], g2[i + 1], log_l[j],
                                 log_l[j + 1]))  # fmt: skip
    if problems:
        refined = _refine(gaps, problems, hints)
        if refined is None:
            return None
        for sign, value in refined:
            found[sign].append(value)
    if not found[1.0] or not found[-1.0]:
        return None
    return max(max(found[1.0]), 0.0), max(max(found[-1.0]), 0.0)


def _refine(
    gaps: _Gaps, problems: list[tuple[bool, float, float, float, float, float, float, float]],
    hints: Hints | None = None,
) -> list[tuple[float, float]]:
    """(sign, epsilon) of each problem at the safe end of its refined bracket (module
    docstring). The bookkeeping is in Python floats (a handful of problems: cheaper than numpy
    calls)."""
    pq = [p[0] for p in problems]
    sign = [p[1] for p in problems]
    orient = [1.0 if p[0] else -1.0 for p in problems]  # > 0 left of the root, <= 0 right
    lo = [float(p[2]) for p in problems]
    hi = [float(p[3]) for p in problems]
    l_lo = [float(p[6]) for p in problems]
    l_hi = [float(p[7]) for p in problems]
    s = gaps.inv.s
    x, push = [], []
    mu = gaps.inv.mu
    tol = XTOL * s
    for i, p in enumerate(problems):
        hint = hints.get((p[0], p[1])) if hints is not None else None
        if hint is not None:  # linear prediction from the last two roots (uncentred)
            move = hint[0] - hint[1]
            guess = hint[0] + move - mu
            if lo[i] < guess < hi[i]:
                x.append(guess)
                # each stored root is off by up to half its bracket's width
                push.append(2.0 * abs(move) + 1.5 * (hint[2] + hint[3]) + tol)
                continue
        g_lo, g_hi = orient[i] * float(p[4]), orient[i] * float(p[5])
        x.append(lo[i] + g_lo * (hi[i] - lo[i]) / (g_lo - g_hi))  # regula falsi start
        push.append(0.05 * (hi[i] - lo[i]))
    live = list(range(len(problems)))
    for _ in range(_ROUNDS):
        live = [
            i for i in live
            if hi[i] - lo[i] > tol and abs(l_hi[i] - l_lo[i]) > _LTOL * max(1.0, abs(l_lo[i]))
        ]  # fmt: skip
        if not live:
            break
        if _DEBUG:
            print([(i, (hi[i] - lo[i]) / s, l_hi[i] - l_lo[i], push[i] / s) for i in live])
        px, ps, pp = [], [], []
        for i in live:  # inside the bracket: at worst halfway to its ends
            px += [max(0.5 * (lo[i] + x[i]), x[i] - push[i]), min(0.5 * (x[i] + hi[i]), x[i] + push[i])]
            ps += [sign[i], sign[i]]
            pp += [pq[i], pq[i]]
        g_f, d_f, l_f = gaps.at(px, ps, pp)
        p_l = [px[2 * r : 2 * r + 2] for r in range(len(live))]
        g_l = [g_f[2 * r : 2 * r + 2] for r in range(len(live))]
        d_l = [d_f[2 * r : 2 * r + 2] for r in range(len(live))]
        l_l = [l_f[2 * r : 2 * r + 2] for r in range(len(live))]
        for r, i in enumerate(live):
            best = (math.inf, 0.0, 0.0)
            sides = 0
            for j in (0, 1):
                xj, gj, dj, lj = p_l[r][j], orient[i] * g_l[r][j], orient[i] * d_l[r][j], l_l[r][j]
                if not (math.isfinite(gj) and math.isfinite(lj)):
                    continue
                if gj > 0:
                    if xj > lo[i]:
                        lo[i], l_lo[i] = xj, lj
                        sides |= 1
                elif xj < hi[i]:
                    hi[i], l_hi[i] = xj, lj
                    sides |= 2
                if dj != 0.0 and abs(gj / dj) < best[0]:
                    best = (abs(gj / dj), xj, -gj / dj)
            h = best[2]
            x_new = best[1] + h
            if math.isfinite(best[0]) and lo[i] < x_new < hi[i]:
                # Newton from distance h misses by about C h^2, C = abs(g'' / (2 g')), g''
                # from the slopes at the two probes (at least 1 / s if they do not tell): the
                # probes go a few times that far (and a quarter tolerance) either side of the
                # new estimate, so that both ends of the bracket tighten
                (x0, x1), (d0, d1) = p_l[r], d_l[r]
                curv = 1.0 / s
                if x1 > x0 and math.isfinite(d0) and math.isfinite(d1) and d0 + d1 != 0.0:
                    curv = max(curv, abs((d1 - d0) / (x1 - x0) / (d0 + d1)))
                miss = max(curv * h * h, _NEWTON_FLOOR * abs(h))
                if sides == 3:  # the probes straddle the root: the secant through them
                    g0, g1 = orient[i] * g_l[r][0], orient[i] * g_l[r][1]
                    miss = max(miss, abs(x0 + g0 * (x1 - x0) / (g0 - g1) - x_new))
                else:  # the probes missed the root: reach farther
                    miss = max(miss, _WIDEN * push[i])
                x[i], push[i] = x_new, _PUSH * miss + 0.25 * tol
            else:  # bisect (the probes a quarter of the bracket either side)
                x[i], push[i] = 0.5 * (lo[i] + hi[i]), 0.25 * (hi[i] - lo[i])
    if hints is not None:
        for i, p in enumerate(problems):
            root, width = 0.5 * (lo[i] + hi[i]) + mu, hi[i] - lo[i]
            prev = hints.get((p[0], p[1]))
            if prev is None:
                hints[(p[0], p[1])] = (root, root, width, width)
            else:
                hints[(p[0], p[1])] = (root, prev[0], width, prev[2])
    out = []
    for i, (is_pq, sgn, *_) in enumerate(problems):
        upper = sgn > 0
        if is_pq:  # epsilon = log L, increasing in x: the upper bound at hi
            value = l_hi[i] if upper else l_lo[i]
        else:  # epsilon = -log L: the upper bound at lo
            value = -(l_lo[i] if upper else l_hi[i])
        out.append((sgn, float(value)))
    return out
