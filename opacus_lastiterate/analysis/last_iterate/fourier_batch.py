"""The kept characteristic function asked after every step of a block of steps at once.

:meth:`.incremental_fourier.IncrementalCharacteristic.solve_steps` answers the weighted
heuristic after each of many appended steps. Its state moves forward as if it were asked
every :data:`BLOCK` steps (:meth:`~.incremental_fourier.IncrementalCharacteristic.solve`);
the steps in between are answered here, from the state at the block's start, left unchanged:

* one characteristic-function update for the block: with n0 the steps taken in and rho(n)
  = R_{n0}(n - 1) the discounted rate of the steps appended since (``incremental_fourier``),
  the frozen steps' sums at step n are their values at n0 moved by rho(n) (the first-order
  vector, mu, s^2 and E2 are polynomials in rho), the active steps' R_t are R_t + beta^(n0 - t)
  rho(n), and the new steps' R_t come from one cumulative sum over the block; every factor of
  every step of the block goes through one :func:`.step_factors.log_factors` call (the
  steps not yet taken at a row have weight 0, a factor of exactly 1);
* the checks and the certified error bound of :mod:`.incremental_fourier`, per row, with
  the rounding of the block's sums charged (each R_t one update more, plus the terms of its
  cumulative sum; the first-order vector one update more);
* the scan of every row by two matrix products, and the roots of every row refined together
  (:func:`solve_many`: the safeguarded Newton iteration of :mod:`.fourier_roots` on arrays,
  started from the scan's brackets), each epsilon read at the safe end of its bracket.

A row is answered where all of it is certified; the others are None (the caller asks
``solve`` at that step).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from opacus_lastiterate.analysis.last_iterate.fourier_roots import XTOL
from opacus_lastiterate.analysis.last_iterate.step_factors import (
    PHASOR_CHARGE,
    Q_NEAR_HALF,
    g_q,
    log_factors,
)
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import ETA, FP_CHARGE

__all__ = []

BLOCK = 32
"""Steps per block: the kept state is asked (and moves forward) at each block's end."""
_ROUNDS = 4
_PUSH, _WIDEN, _LTOL, _NEWTON_FLOOR = 3.0, 1000.0, 1e-8, 1e-3  # as in .fourier_roots
_SQRT_HALF_PI = math.sqrt(math.pi / 2.0)
_SQRT2 = math.sqrt(2.0)
Answer = tuple[float, float, int] | None


def solve_steps(
    char: Any, delta: float, eta: list[float], sigma: list[float], q: list[float],
    accuracy: float, start: int,
) -> list[Answer]:
    """``char.solve`` after each step ``start`` + 1 .. ``len(eta)`` of the run (``start`` at
    least the steps ``char`` has taken in; None for a step it is past already): its state
    moves as if asked every :data:`BLOCK` steps, the steps in between answered from it by
    :func:`block_answers` (where a row is not certified, ``solve`` is asked at that step)."""
    end = len(eta)
    out: list[Answer] = []
    n = start + 1  # the next step to answer
    while n <= end:
        if char.n >= n:  # the state is past this step already
            out.append(None)
            n += 1
            continue
        stop = n  # where the state moves to next
        if char.n == n - 1:
            stop = min(n - 1 + BLOCK, end)
            for got in block_answers(char, delta, eta, sigma, q, accuracy, stop + 1):
                if got is None:
                    stop = n
                    break
                out.append(got)
                n += 1
            if n > stop:  # all answered: the state moves on without a query
                char.solve(delta, eta, sigma, q, accuracy, n=stop, answer=False)
                continue
        out.append(char.solve(delta, eta, sigma, q, accuracy, n=stop))
        n = stop + 1
    return out


def block_answers(
    char: Any, delta: float, eta: list[float], sigma: list[float], q: list[float],
    accuracy: float, stop: int,
) -> list[Answer]:
    """(upper, lower, frequencies) after each step n = ``char.n`` + 1 .. ``stop`` - 1 of the
    run of the per-step lists, from the state of ``char`` (an
    :class:`~.incremental_fourier.IncrementalCharacteristic` asked last at its ``n`` steps,
    with a grid for ``delta``), which is not changed; None where a row is not certified."""
    n0, first, grid = char.n, char.frozen, char.grid
    count = stop - 1 - n0
    if count <= 0:
        return []
    if grid is None or grid.delta != delta or n0 == 0:
        return [None] * count
    rec, beta = char.recursion, char.beta
    eta_new = np.asarray(eta[n0 : stop - 1], dtype=float)
    q_new = np.asarray(q[n0 : stop - 1], dtype=float)
    if np.any(np.abs(q_new - 0.5) < Q_NEAR_HALF):
        return [None] * count
    # cum[i, j]: R of new step n0 + i after step n0 + j (i <= j), one cumulative sum
    idx = np.arange(count)
    expo = idx[None, :] - idx[:, None]
    tri = expo >= 0
    cum = np.cumsum(np.where(tri, eta_new[None, :] * beta ** np.maximum(expo, 0), 0.0), axis=1)
    rho = cum[0]
    a_old = char.r.size
    r_old = char.r[None, :] + rho[:, None] * (beta ** np.arange(a_old, 0, -1.0))[None, :]
    r_new = cum.T  # rows: after step n0 + j; columns: new step n0 + i (0 where i > j)
    eta_old = np.asarray(eta[first:n0], dtype=float)
    d_old, d_new = rec.damping(first, a_old), rec.damping(n0, count)
    if rec.nesterov:
        w = np.concatenate([eta_old + beta * d_old * r_old,
                            np.where(tri.T, eta_new + beta * d_new * r_new, 0.0)], axis=1)  # fmt: skip
    else:
        w = np.concatenate([d_old * r_old, d_new * r_new], axis=1)
    qq = np.concatenate([np.asarray(q[first:n0], dtype=float), q_new])
    s2s = np.asarray(sigma[first : stop - 1], dtype=float) ** 2
    # ages (updates of R_t, for the rounding charge): one more and the block's cumulative sum
    age = np.concatenate([char.r_age[None, :] + (idx[:, None] + 2.0),
                          np.where(tri.T, expo.T + 1.0, 0.0)], axis=1)  # fmt: skip
    lin, quad = char.lin, char.quad
    mu = char.mu0 + lin[0] + rho * lin[1] + w @ qq
    s2 = (char.s20 + lin[2] + rho * lin[3] + quad[0] + 2.0 * rho * quad[1] + rho * rho * quad[2]
          + (w * w) @ s2s)  # fmt: skip
    e2 = quad[3] + 2.0 * rho * quad[4] + rho * rho * quad[5]
    ok = s2 > 0.0
    s = np.sqrt(np.where(ok, s2, 1.0))
    tail = ETA * delta
    a_end = s * float(special.ndtri(tail)) - mu
    theta_min = math.sqrt(2.0 * (-math.log(tail) + 1.0)) / s
    m = int(np.max(np.ceil(theta_min / grid.step - 0.5))) + 1
    if m > grid.m:
        return [None] * count
    # the checks of IncrementalCharacteristic._fits, per row
    max_eta = max(char.max_eta, float(eta_new.max()))
    top = max_eta * max(1.0, 1.0 - char.damp) / (1.0 - beta)
    w_top = max_eta + beta * top if char.nesterov else top
    lam = grid.lam
    if lam * w_top > 700.0:
        return [None] * count
    chern = grid.expm1 + lam * math.exp(lam * w_top) * (lin[0] + rho * lin[1])
    chern = chern + np.expm1(lam * w) @ qq
    b_end = (0.5 * lam * lam * s2 + chern - math.log(tail)) / lam - mu
    ok &= (a_end >= grid.lo) & (b_end <= grid.hi)
    # the factors of every row at once: (m, rows, steps), summed over the steps
    rows, width = w.shape
    re, im, _, _ = log_factors(w.ravel(), np.tile(qq, rows), grid.step, m)
    re_sum = re.reshape(m, rows, width).sum(axis=2)
    im3 = im.reshape(m, rows, width)
    im_sum, im_abs = im3.sum(axis=2), np.abs(im3).sum(axis=2)
    theta, k = grid.theta[:m, None], grid.k[:m, None]
    first_vec = grid.first[:m, None] + grid.first_y[:m, None] * rho[None, :]
    st2 = (s[None, :] * theta) ** 2
    log_phi = (grid.log_frozen()[:m, None] + first_vec + (re_sum - 0.5 * st2)
               + 1j * (im_sum - theta * mu[None, :]))  # fmt: skip
    phi = np.exp(log_phi)
    step, span = grid.step, grid.hi - grid.lo
    theta_m = (m + 0.5) * step
    ratio = np.exp(-s * s * step * theta_m)
    truncation = np.exp(-0.5 * (s * theta_m) ** 2) / (math.pi * (m + 0.5)) / (1.0 - ratio)
    size = (grid.size[:m, None] + (im_abs - re_sum) + np.abs(first_vec)
            + theta * np.abs(mu)[None, :] + 0.5 * st2)  # fmt: skip
    w_round = char.w_round + (w * FP_CHARGE * (age + 4.0 + PHASOR_CHARGE)) @ g_q(qq)
    n_row = n0 + 1.0 + idx
    rel = FP_CHARGE * (size * (4.0 + PHASOR_CHARGE + 2.0 * np.log2(n_row + 1.0)[None, :]
                               + theta * w_top) + math.log2(m + 1) + 4.0 + theta * span)
    rel = rel + theta * w_round[None, :]
    first_abs = grid.first_abs[:m, None] + grid.first_abs_y[:m, None] * rho[None, :]
    rel = rel + FP_CHARGE * (char.syncs + 5.0) * first_abs
    rel = rel + theta * ((grid.drop_x + rho * grid.drop_y) + grid.w_round)[None, :]
    abs_phi = np.abs(phi)
    rounding = (abs_phi * rel / k).sum(axis=0) / math.pi
    big_r = 0.5 * theta * theta * e2[None, :]
    freeze = (np.exp(-0.5 * st2) * big_r * np.exp(big_r) / k).sum(axis=0)
    error = 2.0 * tail + truncation + rounding + freeze / math.pi
    ok &= error < 1e-3 * delta
    # the scan of every row: (rows, lattice points)
    kk = grid.k[:m]
    cos, sin = grid.cos[:, :m], grid.sin[:, :m]
    cdf = 0.5 - (cos @ (phi.imag / k) - sin @ (phi.real / k)).T / math.pi
    pdf = (step / math.pi) * (cos @ phi.real + sin @ phi.imag).T
    got = solve_many(grid.xs, cdf, pdf, s, mu, error, phi.T, kk * step, kk, step, delta)
    out: list[Answer] = []
    for j in range(count):
        pair = got[j]
        if not ok[j] or pair is None:
            out.append(None)
            continue
        upper, lower = pair
        if not lower <= upper or (upper > 0 and (upper - lower) / upper > accuracy):
            out.append(None)
        else:
            out.append((upper, lower, m))
    return out


def solve_many(
    xs: np.ndarray, cdf: np.ndarray, pdf: np.ndarray, s: np.ndarray, mu: np.ndarray,
    error: np.ndarray, phi: np.ndarray, theta: np.ndarray, k: np.ndarray, step: float,
    delta: float,
) -> list[tuple[float, float] | None]:
    """:func:`.fourier_roots.solve_epsilons` for many inversions on one grid (rows of
    ``cdf``, ``pdf`` at the points ``xs``; ``s``, ``mu``, ``error`` and ``phi`` per row):
    (upper, lower) per row, or None where its scan does not certify them."""
    rows, n = cdf.shape
    floor = 1e3 * error / s
    log_s = np.log(s) + 0.5 * math.log(2.0 * math.pi)
    z = (xs[None, :] + mu[:, None]) / s[:, None]
    solid = pdf > floor[:, None]
    safe = np.where(solid, pdf, 1.0)
    log_l = np.where(solid, np.log(safe) + 0.5 * z * z + log_s[:, None], np.nan)
    inv_l = np.exp(-np.where(solid, log_l, 0.0))
    tail_q = safe * (s[:, None] * _SQRT_HALF_PI) * special.erfcx(z / _SQRT2)
    g_pq = (1.0 - cdf) - tail_q - delta
    g_qp = special.ndtr(z) - cdf * inv_l - delta
    finite = solid
    filled = np.where(finite, log_l, -np.inf)
    before = np.concatenate([np.full((rows, 1), -np.inf),
                             np.maximum.accumulate(filled, axis=1)[:, :-1]], axis=1)  # fmt: skip
    bad = ~finite.any(axis=1) | (finite & ~(filled > before)).any(axis=1)
    above = finite & (log_l >= 0.0)
    below = finite & (log_l <= 0.0)
    has_above, has_below = above.any(axis=1), below.any(axis=1)
    first = np.argmax(above, axis=1)
    lo_i = np.argmax(below, axis=1)
    last = n - np.argmax(below[:, ::-1], axis=1)
    pos = np.arange(n)[None, :]
    r = np.arange(rows)
    found = {1.0: np.full(rows, -np.inf), -1.0: np.full(rows, -np.inf)}
    probs: list[tuple[np.ndarray, bool, float, np.ndarray]] = []  # rows, P -> Q, sign, index
    for sign in (1.0, -1.0):
        g1 = g_pq + sign * error[:, None]
        direct = has_above & (g1[r, first] <= 0.0)
        value = log_l[r, first] if sign > 0 else np.zeros(rows)
        found[sign] = np.where(direct, np.maximum(found[sign], value), found[sign])
        need = has_above & ~direct
        okp = np.isfinite(g1) & (pos >= first[:, None])
        left = g1 > 0
        change = okp[:, :-1] & okp[:, 1:] & left[:, :-1] & ~left[:, 1:]
        bad |= need & (change.sum(axis=1) != 1)
        sel = np.flatnonzero(need & ~bad)
        probs.append((sel, True, sign, np.argmax(change, axis=1)[sel]))
        g2 = g_qp + sign * error[:, None] * inv_l
        g_end = g2[r, np.maximum(last - 1, 0)]
        direct = has_below & (g_end <= 0.0)
        value = -log_l[r, np.maximum(last - 1, 0)] if sign > 0 else np.zeros(rows)
        found[sign] = np.where(direct, np.maximum(found[sign], value), found[sign])
        need = has_below & ~direct
        okq = np.isfinite(g2) & (pos >= lo_i[:, None]) & (pos < last[:, None])
        left = g2 < 0
        change = okq[:, :-1] & okq[:, 1:] & left[:, :-1] & ~left[:, 1:]
        bad |= need & (change.sum(axis=1) != 1)
        sel = np.flatnonzero(need & ~bad)
        probs.append((sel, False, sign, np.argmax(change, axis=1)[sel]))
    p_row = np.concatenate([p[0] for p in probs])
    if p_row.size:
        pq = np.concatenate([np.full(p[0].size, p[1]) for p in probs])
        sg = np.concatenate([np.full(p[0].size, p[2]) for p in probs])
        j = np.concatenate([p[3] for p in probs])
        g_all = np.where(pq, g_pq[p_row, j] + sg * error[p_row],
                         -(g_qp[p_row, j] + sg * error[p_row] * inv_l[p_row, j]))  # fmt: skip
        g_nxt = np.where(pq, g_pq[p_row, j + 1] + sg * error[p_row],
                         -(g_qp[p_row, j + 1] + sg * error[p_row] * inv_l[p_row, j + 1]))  # fmt: skip
        # the start: x at g = 0 of the cubic through the scan's four points around the
        # bracket, g as the variable (inverse interpolation); else regula falsi
        pts = np.clip(j[:, None] + np.arange(-1, 3)[None, :], 0, n - 1)
        rr = p_row[:, None]
        g4 = np.where(pq[:, None], g_pq[rr, pts] + (sg * error[p_row])[:, None],
                      g_qp[rr, pts] + (sg * error[p_row])[:, None] * inv_l[rr, pts])  # fmt: skip
        x4 = xs[pts]
        with np.errstate(divide="ignore", invalid="ignore"):
            start = np.zeros(p_row.size)
            for a in range(4):
                term = x4[:, a]
                for b in range(4):
                    if b != a:
                        term = term * g4[:, b] / (g4[:, b] - g4[:, a])
                start = start + term
        values = _refine(_Gaps(phi, theta, k, step, s, mu, error, floor, log_s, delta),
                         p_row, pq, sg, xs[j], xs[j + 1], g_all, g_nxt, log_l[p_row, j],
                         log_l[p_row, j + 1], start)  # fmt: skip
        for sign in (1.0, -1.0):
            at = sg == sign
            np.maximum.at(found[sign], p_row[at], values[at])
    out: list[tuple[float, float] | None] = []
    for i in range(rows):
        up, low = found[1.0][i], found[-1.0][i]
        if bad[i] or not (up > -np.inf and low > -np.inf):
            out.append(None)
        else:
            out.append((max(float(up), 0.0), max(float(low), 0.0)))
    return out


class _Gaps:
    """The gap functions of :mod:`.fourier_roots` at any points of any rows."""

    def __init__(self, phi: np.ndarray, theta: np.ndarray, k: np.ndarray, step: float,
                 s: np.ndarray, mu: np.ndarray, error: np.ndarray, floor: np.ndarray,
                 log_s: np.ndarray, delta: float) -> None:  # fmt: skip
        a, b = phi / k, phi * theta
        # (rows, 2m, 3): the cosine parts, then the sine parts (module .fourier_roots)
        self.v = np.concatenate([np.stack([a.imag, phi.real, b.imag], axis=2),
                                 np.stack([-a.real, phi.imag, -b.real], axis=2)], axis=1)  # fmt: skip
        self.theta, self.c = theta, step / math.pi
        self.s, self.mu, self.error, self.floor, self.log_s = s, mu, error, floor, log_s
        self.delta = delta

    def at(self, x: np.ndarray, row: np.ndarray, pq: np.ndarray, sign: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """(g, g', log L) at the points ``x`` of the rows ``row`` (NaN below the floor)."""
        ph = x[:, None] * self.theta[None, :]
        f = np.matmul(np.concatenate([np.cos(ph), np.sin(ph)], axis=1)[:, None, :],
                      self.v[row])[:, 0]  # fmt: skip
        cdf, pdf, slope = 0.5 - f[:, 0] / math.pi, self.c * f[:, 1], self.c * f[:, 2]
        s, mu = self.s[row], self.mu[row]
        solid = pdf > self.floor[row]
        safe = np.where(solid, pdf, 1.0)
        z = (x + mu) / s
        log_l = np.log(safe) + 0.5 * z * z + self.log_s[row]
        dlog = slope / safe + z / s
        err = sign * self.error[row]
        tail_q = safe * s * _SQRT_HALF_PI * special.erfcx(z / _SQRT2)
        inv_l = np.exp(-np.where(pq, 0.0, log_l))
        g = np.where(pq, (1.0 - cdf) - tail_q - (self.delta - err),
                     special.ndtr(z) - cdf * inv_l - (self.delta - err * inv_l))  # fmt: skip
        d = np.where(pq, -tail_q * dlog, (cdf - err) * inv_l * dlog)
        nan = np.where(solid, 1.0, np.nan)
        return g * nan, d * nan, log_l * nan


def _refine(
    gaps: _Gaps, row: np.ndarray, pq: np.ndarray, sign: np.ndarray, lo: np.ndarray,
    hi: np.ndarray, g_lo: np.ndarray, g_hi: np.ndarray, l_lo: np.ndarray, l_hi: np.ndarray,
    start: np.ndarray,
) -> np.ndarray:
    """The epsilon of each problem at the safe end of its refined bracket (``g_lo`` and
    ``g_hi`` oriented: > 0 left of the root; ``start``: a guess, used where it is inside the
    bracket, probed a thousandth of the bracket either side)."""
    lo, hi, l_lo, l_hi = lo.copy(), hi.copy(), l_lo.copy(), l_hi.copy()
    orient = np.where(pq, 1.0, -1.0)
    s = gaps.s[row]
    tol = XTOL * s
    inside = (lo < start) & (start < hi)
    x = np.where(inside, start, lo + g_lo * (hi - lo) / (g_lo - g_hi))
    push = np.where(inside, 1e-3, 0.05) * (hi - lo)
    live = np.ones(lo.size, dtype=bool)
    for _ in range(_ROUNDS):
        live &= (hi - lo > tol) & (np.abs(l_hi - l_lo) > _LTOL * np.maximum(1.0, np.abs(l_lo)))
        i = np.flatnonzero(live)
        if not i.size:
            break
        xi, li, hi_i = x[i], lo[i], hi[i]
        p = np.stack([np.maximum(0.5 * (li + xi), xi - push[i]),
                      np.minimum(0.5 * (xi + hi_i), xi + push[i])], axis=1)  # fmt: skip
        rr = np.repeat(row[i], 2)
        g, d, lv = gaps.at(p.ravel(), rr, np.repeat(pq[i], 2), np.repeat(sign[i], 2))
        g = (g.reshape(-1, 2) * orient[i, None])
        d_raw = d.reshape(-1, 2)
        d = d_raw * orient[i, None]
        lv = lv.reshape(-1, 2)
        sides = np.zeros(i.size, dtype=int)
        best = np.full(i.size, np.inf)
        bx = np.zeros(i.size)
        bh = np.zeros(i.size)
        for jj in (0, 1):
            xj, gj, dj, lj = p[:, jj], g[:, jj], d[:, jj], lv[:, jj]
            fin = np.isfinite(gj) & np.isfinite(lj)
            up = fin & (gj > 0) & (xj > lo[i])
            lo[i] = np.where(up, xj, lo[i])
            l_lo[i] = np.where(up, lj, l_lo[i])
            sides |= np.where(up, 1, 0)
            dn = fin & ~(gj > 0) & (xj < hi[i])
            hi[i] = np.where(dn, xj, hi[i])
            l_hi[i] = np.where(dn, lj, l_hi[i])
            sides |= np.where(dn, 2, 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.abs(gj / dj)
            better = fin & (dj != 0.0) & (ratio < best)
            best = np.where(better, ratio, best)
            bx = np.where(better, xj, bx)
            bh = np.where(better, -gj / np.where(dj != 0.0, dj, 1.0), bh)
        x_new = bx + bh
        newton = np.isfinite(best) & (lo[i] < x_new) & (x_new < hi[i])
        x0, x1 = p[:, 0], p[:, 1]
        d0, d1 = d_raw[:, 0], d_raw[:, 1]
        curv = 1.0 / s[i]
        usable = (x1 > x0) & np.isfinite(d0) & np.isfinite(d1) & (d0 + d1 != 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            c2 = np.abs((d1 - d0) / (x1 - x0) / (d0 + d1))
        curv = np.where(usable, np.maximum(curv, np.where(usable, c2, 0.0)), curv)
        miss = np.maximum(curv * bh * bh, _NEWTON_FLOOR * np.abs(bh))
        g0, g1 = g[:, 0], g[:, 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            secant = np.abs(x0 + g0 * (x1 - x0) / (g0 - g1) - x_new)
        miss = np.where(sides == 3, np.maximum(miss, np.nan_to_num(secant)),
                        np.maximum(miss, _WIDEN * push[i]))  # fmt: skip
        x[i] = np.where(newton, x_new, 0.5 * (lo[i] + hi[i]))
        push[i] = np.where(newton, _PUSH * miss + 0.25 * tol[i], 0.25 * (hi[i] - lo[i]))
    upper = sign > 0
    return np.where(pq, np.where(upper, l_hi, l_lo), -np.where(upper, l_lo, l_hi))
