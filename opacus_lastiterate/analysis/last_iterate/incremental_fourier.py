"""The grid-free weighted heuristic of a growing SGD run, its characteristic function kept
up to date step by step (no O(T) work per query).

:mod:`.weighted_fourier` inverts the characteristic function of X = K + Z,

    phi(theta) = exp(-s^2 theta^2 / 2) prod_t f_t(theta),  f_t = 1 - q_t + q_t e^{i w_t(T) theta},

which costs O(T M) from all T weights (what a new instance does at its first query). Here
(heavy-ball or nesterov SGD without weight decay, one momentum beta, dampening d;
``optimizer_weights``) the weight of step t after T steps is w_t(T) = a_t R_t(T) (nesterov: eta_t + beta a_t R_t(T)) with
R_t(T) = sum_{s=t..T} eta_s beta^(s-t). Appending step T + 1 adds eta_{T+1} beta^(T+1-t) to
R_t: every weight still grows, but an old step's growth is geometrically small.

Freezing
--------
At a query (the last step being T_f), each step whose predicted further growth is small
enough is *frozen*: its factor log f_t is computed once, at its current weight w^f = w_t(T_f),
and added to a running (pairwise) sum. Its exact weight at any later T is

    w_t(T) = w^f + c_t rho_t(T),   c_t = a_t beta^(T_f + 1 - t) (x beta for nesterov),
    rho_t(T) = R_{T_f+1}(T) >= 0,

and log f_t is analytic in w (f_t != 0 when q_t != 1/2), with d/dw log f_t = i theta g_t,
g_t = q_t e^{i w theta} / f_t, and abs(d^2/dw^2 log f_t) <= theta^2 C(q_t),
C(q) = q (1 - q) / (1 - 2 q)^2. So, by Taylor's theorem,

    sum_frozen log f_t(w_t(T)) = sum log f_t(w^f) + sum_t i theta g_t(w^f) c_t rho_t(T) + r,
    abs(r) <= theta^2 E2 / 2,   E2 = sum_t C(q_t) (c_t rho_t(T))^2.

The first-order term is kept exactly, and so are s^2 = sum sigma_t^2 w_t(T)^2 and
mu = sum q_t w_t(T): all are sums of k_t rho_t(T)^p (p = 0, 1, 2), and since every
rho_t(T') = rho_t(T) + beta^(T + 1 - j_t) R_{T+1}(T') (j_t = T_f + 1), each such sum moves
forward from one query to the next with a few companion sums (sum k rho beta^(T+1-j),
sum k beta^(2 (T+1-j))), O(1) per sum and O(M) per frequency vector, whatever the number of
steps in between. With the frozen part then off from the exact one by at most abs(r) in
log phi (and abs(phi) <= exp(-s^2 theta^2 / 2) for the exact one),

    abs(delta phi(theta)) <= exp(-s^2 theta^2 / 2) R e^R,   R = theta^2 E2 / 2,

which adds sum_k abs(delta phi(theta_k)) / (pi (k + 1/2)) to the error bound e of
:mod:`.weighted_fourier` (``freeze`` below). A step is frozen once its predicted share of E2
(its growth bounded with ``RATE_SAFETY`` x the largest rate of the active steps) keeps that term below
``FREEZE_ERROR`` x delta; the bound used is the exact E2 of the query, so a later rate above
the prediction only loosens the bracket (and a bracket wider than the accuracy is declined:
the caller answers from scratch). A run with a step within ``Q_NEAR_HALF`` of q = 1/2 is
declined (:mod:`.step_factors`), so C stays bounded; at q = 1, C = 0.

The active steps (under about 100 for beta = 0.9) enter with their exact current weights.

The frequency grid and the scan
-------------------------------
The frequencies (k + 1/2) Delta and the interval R = [A, B] (centred coordinates) are fixed
when the grid is built, with a margin ``GRID_MARGIN`` of the span on each side; at each query
A <= s Phi^{-1}(1e-9 delta) - mu and B >= (Chernoff bound at the grid's lambda) - mu are
checked (the Chernoff sum of the frozen steps is kept at their frozen weights, plus
lambda e^{lambda w_bound} sum_t q_t c_t rho_t(T) for their growth), and so is M(T) <= M of the
grid. Aliasing and truncation are bounded as in :mod:`.weighted_fourier` with D = B - A and
the current s. When they fail the grid is rebuilt (an O(T M) step, rare: the span grows like
s, about sqrt(T)). A rebuild refreezes every frozen step at its current weight (coefficient
c_t beta^(T + 1 - j_t), rho = 0), so E2 of the old expansion still bounds the remainder; the
first-order term is kept only for coefficients above 1e-16 (the steps of the last few
hundred), the others are charged theta sum q_t / abs(1 - 2 q_t) c_t rho_t in log phi. The
scan points are a fixed lattice on [A, B] whose cos/sin tables are cached, so the scan is two
matrix-vector products; the roots are refined by :func:`.fourier_roots.solve_epsilons`.

The next grid is built ahead, a block per query (the *shadow*): once the run has used
``_SHADOW_START`` of a margin of the grid (A or B at step T against their values when it was
made), a grid for the current run is made (an O(T) Chernoff bound) and the frozen steps are
folded into it at their current weights, R_t(T) = R_t(n0) + beta^(n0 - t) R_{n0}(T) with
R_{n0}(T) kept step by step, in shares sized to finish when ``_SHADOW_SWITCH`` of the margin
is predicted to be used, where it takes over; steps frozen after it started are folded into
both grids as they freeze. A worn grid (its tails near the ends of the interval) can still
pass the checks above while its aliasing error lifts the noise floor of p~ over a root: a
query that the grid does not certify is asked again on the shadow (its remaining steps folded
then) or on a grid built now. A step refolded later has grown less since then than since it was frozen,
so E2 still bounds its remainder; its first-order terms and rounding are kept per grid.

Rounding is charged as in :mod:`.weighted_fourier` (8 machine epsilons per operation times
the size of every sum, the pairwise sums charged log2 of their length twice: the sums over
steps run along numpy's contiguous axis, where it sums pairwise, in blocks whose sums are
added pairwise: :mod:`.characteristic_grid`), plus the
rounding of the recursively kept weights (8 epsilons per update of R_t, times the weight)
and of the first-order vector (8 epsilons per update, times the sum of its magnitudes). The
factors' half-angle sines and cosines are products of two directly computed ones
(:func:`.characteristic_grid.log_factors`): each factor is charged ``PHASOR_CHARGE`` more
relative to its magnitude and to its weight.

Rebuilds and checkpoints
------------------------
No per-step arrays of the frozen steps are kept: a rebuild recomputes their current weights
from the run (one backward filter over the rates, continued from the first active step's
R_t(T); its rounding, at most about 2 / (1 - beta) + 2 updates, is charged like that of the
kept R_t) and their growth coefficients a_t beta^(T + 1 - t). :meth:`IncrementalCharacteristic.state`
saves everything else (a few scalars, the active steps' R_t, the grid's frequency vectors) as
plain lists, tied to the run by :func:`run_fingerprint`; :meth:`~IncrementalCharacteristic.
from_state` restores it only onto the same run, which then continues with the same floats.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from opacus_lastiterate.analysis.last_iterate.characteristic_grid import FrequencyGrid, new_grid
from opacus_lastiterate.analysis.last_iterate.characteristic_shadow import ShadowGrid
from opacus_lastiterate.analysis.last_iterate.fourier_batch import solve_steps
from opacus_lastiterate.analysis.last_iterate.fourier_roots import solve_epsilons
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import HeavyBallRecursion
from opacus_lastiterate.analysis.last_iterate.step_factors import (
    PHASOR_CHARGE,
    Q_NEAR_HALF,
    c_q,
    g_q,
    log_factors,
)
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import (
    ETA,
    FP_CHARGE,
    Inversion,
)

__all__ = [
    "FREEZE_ERROR",
    "GRID_MARGIN",
    "IncrementalCharacteristic",
]

FREEZE_ERROR = 1e-6
"""Freezing adds at most about this times delta to the error bound (predicted)."""
GRID_MARGIN = 0.25
"""The grid's interval extends by this times its span on each side."""
RATE_SAFETY = 2.0  # later rates predicted <= RATE_SAFETY x the largest active one (freezing)
_FP = FP_CHARGE
_FREEZE_BLOCK = 16  # steps are frozen in blocks of at least this many (less work per query)
_BUILD_BLOCK = 1 << 16  # a new grid takes in the frozen steps this many at a time (memory)
_SHADOW_START = 0.3  # the next grid is started when this share of a margin is used
_SHADOW_SWITCH = 0.6  # ... and takes over, folded by then, when this share is used
STATE_FORMAT = 2
"""Version of :meth:`IncrementalCharacteristic.state` (a state of another version is not
restored: the characteristic function is then rebuilt from the run)."""
_SCALARS = ("n", "frozen", "max_eta", "mu0", "s20", "w_round", "w_max", "syncs", "rebuilds",
            "switches", "_shadow_retry", "_b_end", "_retry_at")  # fmt: skip


def run_fingerprint(
    eta: Sequence[float], sigma: Sequence[float], q: Sequence[float], settings: tuple
) -> str:
    """A digest of a run's per-step rates, noise multipliers, sample rates and SGD settings
    (a saved characteristic function is restored only onto the run it was computed for)."""
    h = hashlib.sha256(repr((STATE_FORMAT, len(eta), tuple(settings))).encode())
    for values in (eta, sigma, q):
        h.update(np.asarray(values, dtype=np.float64).tobytes())
    return h.hexdigest()


class IncrementalCharacteristic:
    """Upper and lower bounds on the weighted heuristic epsilon of a growing heavy-ball or
    nesterov SGD run (one momentum ``beta`` and ``dampening``, no weight decay), with the
    characteristic function kept up to date (module docstring). The run's per-step lists
    are passed to :meth:`solve` (they only grow) and read from where the last call stopped.
    """

    def __init__(self, beta: float, dampening: float, nesterov: bool) -> None:
        self.beta = float(beta)
        self.damp = float(dampening) if beta > 0 else 0.0
        self.nesterov = bool(nesterov) and beta > 0
        self.recursion = HeavyBallRecursion(self.beta, self.damp, self.nesterov)
        self.n = 0  # steps taken in
        self.frozen = 0  # steps 0..frozen-1 are frozen
        self.r = np.zeros(0)  # R_t(T) of the active steps frozen..n-1
        self.r_age = np.zeros(0)  # updates of each active R_t (rounding)
        self.max_eta = 0.0
        # sums over the frozen steps: constants, linear (x, y) and quadratic (x, y, z) in rho
        self.mu0 = self.s20 = 0.0
        self.lin = [0.0, 0.0, 0.0, 0.0]  # mu: x, y; s^2: x, y
        self.quad = [0.0] * 6  # s^2: x, y, z; E2: x, y, z
        self.w_round = 0.0  # sum q/|1-2q| x rounding of w^f
        self.w_max = 0.0
        self.syncs = 0
        self.grid: FrequencyGrid | None = None
        self.shadow: ShadowGrid | None = None  # the next grid, built a block per query
        self.switches = 0  # grids taken over from a shadow (not rebuilt at a query)
        self._shadow_retry = 0  # no shadow is started before this step (one failed to start)
        self._b_end = 0.0  # B of the run at the last query (from _fits)
        self._retry_at = 0  # no new grid for a failed query before this step
        self._pw = np.ones(1)
        self.rebuilds = 0
        self._q_seen = 0  # sample rates checked against Q_NEAR_HALF (not saved: rechecked)
        self._near_half = False
        self.last: tuple[np.ndarray, np.ndarray, float, float, np.ndarray] | None = None
        """(theta, phi, s, mu, bound on abs(phi - exact phi)) of the last query (checks)."""

    # -- the run ----------------------------------------------------------------------------

    def _powers(self, n: int) -> np.ndarray:
        """beta^0 .. beta^n."""
        if self._pw.size <= n:
            self._pw = self.beta ** np.arange(2 * n + 2, dtype=float)
        return self._pw[: n + 1]

    def _sync(self, eta: list[float], n_new: int) -> None:
        """Take in the steps appended since the last call, up to ``n_new`` (module docstring)."""
        add = n_new - self.n
        if add <= 0:
            return
        new = np.asarray(eta[self.n : n_new], dtype=float)
        self.max_eta = max(self.max_eta, float(new.max()))
        beta = self.beta
        if add == 1:
            r_new = new
        else:
            r_new = self.recursion.discounted_rates(new)
        rho = float(r_new[0])  # R_{T+1}(T'), T the last step taken in before
        decay = beta**add
        if self.r.size:
            pw = self._powers(self.r.size)
            self.r = self.r + rho * pw[self.r.size : 0 : -1]
            self.r_age = self.r_age + 1.0
        self.r = np.concatenate([self.r, r_new])
        # rounding of the new R_t: the backward recursion r = eta + beta r loses about 2 ulps
        # per step, damped by beta: at most about 2 / (1 - beta) ulps (charged as updates)
        fresh = np.arange(add, 0, -1, dtype=float)
        if beta > 0.0:
            fresh = np.minimum(fresh, 2.0 / (1.0 - beta) + 2.0)
        self.r_age = np.concatenate([self.r_age, fresh])
        lin, quad = self.lin, self.quad
        for i in (0, 2):
            lin[i] += rho * lin[i + 1]
            lin[i + 1] *= decay
        for i in (0, 3):
            x, y, z = quad[i : i + 3]
            quad[i : i + 3] = [x + 2.0 * rho * y + rho * rho * z, decay * (y + rho * z),
                               decay * decay * z]  # fmt: skip
        if self.grid is not None:
            self.grid.advance(rho, decay)
        if self.shadow is not None:
            self.shadow.advance(rho, decay, self.n)
        self.n = n_new
        self.syncs += 1

    def _freeze(self, count: int, eta: list[float], sigma: list[float], q: list[float]) -> None:
        """Freeze the ``count`` oldest active steps at their current weights."""
        first, t_now = self.frozen, self.n - 1
        r = self.r[:count]
        w = self.recursion.weights(first, r, np.asarray(eta[first : first + count]))
        c = self.recursion.growth(first, count, t_now + 1)
        qq = np.asarray(q[first : first + count], dtype=float)
        s2 = np.asarray(sigma[first : first + count], dtype=float) ** 2
        self.mu0 += float(np.dot(qq, w))
        self.s20 += float(np.dot(s2, w * w))
        self.lin[1] += float(np.dot(qq, c))
        self.lin[3] += float(np.dot(2.0 * s2 * w, c))
        self.quad[2] += float(np.dot(s2, c * c))
        self.quad[5] += float(np.dot(c_q(qq), c * c))
        self.w_round += float(np.dot(g_q(qq), _FP * (self.r_age[:count] + 4.0 + PHASOR_CHARGE) * w))
        self.w_max = max(self.w_max, float(w.max()))
        if self.grid is not None:
            self.grid.fold(w, qq, c)
        if self.shadow is not None:  # steps appended since it started: folded as they freeze
            self.shadow.fold_frozen(first, w, qq, c)
        self.r, self.r_age = self.r[count:], self.r_age[count:]
        self.frozen += count

    def _weight_bound(self) -> float:
        """An upper bound on every weight (all rates so far <= max_eta)."""
        beta = self.beta
        top = self.max_eta * max(1.0, (1.0 - self.damp)) / (1.0 - beta)
        return self.max_eta + beta * top if self.nesterov else top

    # -- saving and restoring (a checkpoint) ---------------------------------------------------

    def state(self, eta: list[float], sigma: list[float], q: list[float]) -> dict[str, Any]:
        """The whole state as plain lists and floats (exact: every float round-trips), for
        the run of these per-step lists, which it is tied to by :func:`run_fingerprint`."""
        n = self.n
        out: dict[str, Any] = {
            "format": STATE_FORMAT,
            "fingerprint": run_fingerprint(eta[:n], sigma[:n], q[:n], self.settings),
            "r": self.r.tolist(), "r_age": self.r_age.tolist(),
            "lin": list(self.lin), "quad": list(self.quad),
        }  # fmt: skip
        out.update({k: getattr(self, k) for k in _SCALARS})
        out["grid"] = None if self.grid is None else self.grid.as_dict()
        out["shadow"] = None if self.shadow is None else self.shadow.as_dict()
        return out

    @property
    def settings(self) -> tuple[float, float, bool]:
        """(beta, dampening, nesterov) of the run."""
        return (self.beta, self.damp, self.nesterov)

    @classmethod
    def from_state(
        cls, state: Mapping[str, Any], eta: list[float], sigma: list[float], q: list[float],
        settings: tuple[float, float, bool],
    ) -> IncrementalCharacteristic | None:
        """The characteristic function saved by :meth:`state`, if it was saved for this run
        (its first ``state["n"]`` steps; the others are taken in at the next query), else
        None. A malformed state is also None: it is a cache, rebuilt from the run."""
        try:
            if state.get("format") != STATE_FORMAT:
                return None
            n = int(state["n"])
            if not 0 < n <= len(eta) or state["fingerprint"] != run_fingerprint(
                eta[:n], sigma[:n], q[:n], settings
            ):
                return None
            char = cls(*settings)
            for k in _SCALARS:
                setattr(char, k, type(getattr(char, k))(state[k]))
            char.r = np.array(state["r"], dtype=float)
            char.r_age = np.array(state["r_age"], dtype=float)
            char.lin = [float(x) for x in state["lin"]]
            char.quad = [float(x) for x in state["quad"]]
            ok = (char.r.shape == char.r_age.shape == (n - char.frozen,) and len(char.lin) == 4
                  and len(char.quad) == 6)  # fmt: skip
            if state["grid"] is not None:
                char.grid = FrequencyGrid.from_dict(state["grid"])
            if state["shadow"] is not None:
                char.shadow = ShadowGrid.from_dict(state["shadow"], eta[:n], char.recursion)
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return char if ok else None

    # -- a query ----------------------------------------------------------------------------

    def solve_steps(
        self, delta: float, eta: list[float], sigma: list[float], q: list[float],
        accuracy: float, start: int,
    ) -> list[tuple[float, float, int] | None]:
        """:meth:`solve` after each step ``start`` + 1 .. ``len(eta)`` of the run, in blocks
        (:func:`.fourier_batch.solve_steps`)."""
        return solve_steps(self, delta, eta, sigma, q, accuracy, start)

    def solve(
        self, delta: float, eta: list[float], sigma: list[float], q: list[float],
        accuracy: float, n: int | None = None, answer: bool = True,
    ) -> tuple[float, float, int] | None:
        """(upper, lower, frequencies) epsilon at ``delta`` for the run of the per-step lists
        (sigma_t > 0, q_t in (0, 1]) up to step ``n`` (default: all), or None when not
        certified within ``accuracy`` (``answer`` False: the state moves to step ``n`` and
        nothing is evaluated unless the grid is rebuilt; None)."""
        self._sync(eta, len(eta) if n is None else n)
        n = self.n
        if self._q_seen < n:  # a step with q near 1/2 makes the route decline the run
            new_q = np.asarray(q[self._q_seen : n], dtype=float)
            self._near_half = self._near_half or bool(np.any(np.abs(new_q - 0.5) < Q_NEAR_HALF))
            self._q_seen = n
        if n == 0 or self._near_half:
            return None
        first = self.frozen
        # the active steps a block at a time (a long run's first query: O(block) temporaries)
        blocks = [(lo, min(n, lo + _BUILD_BLOCK)) for lo in range(first, n, _BUILD_BLOCK)]
        s2_act = mu_act = eta_max = 0.0
        for lo, hi in blocks:
            eta_b = np.asarray(eta[lo:hi], dtype=float)
            w_b = self.recursion.weights(lo, self.r[lo - first : hi - first], eta_b)
            s2_b = np.asarray(sigma[lo:hi], dtype=float) ** 2
            s2_act += float(np.dot(s2_b, w_b * w_b))
            mu_act += float(np.dot(np.asarray(q[lo:hi], dtype=float), w_b))
            eta_max = max(eta_max, float(eta_b.max()))
        lin, quad = self.lin, self.quad
        s2 = self.s20 + lin[2] + quad[0] + s2_act
        mu = self.mu0 + lin[0] + mu_act
        if not s2 > 0.0:
            return None
        s = math.sqrt(s2)
        # freeze the leading active steps whose predicted share of E2 is small enough
        count = n - first  # beta = 0: the weights never change
        if self.beta > 0.0 and blocks:
            kappa = FREEZE_ERROR * delta * 2.0 * math.pi * s2 / n
            growth = RATE_SAFETY * eta_max / (1.0 - self.beta)
            for lo, hi in blocks:
                age = (n - 1) - np.arange(lo, hi)
                c = (self.beta if self.nesterov else 1.0) * self.recursion.damping(lo, hi - lo)
                c = c * self.beta ** (age + 1.0) * growth
                ok = c_q(np.asarray(q[lo:hi], dtype=float)) * c * c <= kappa
                if not ok.all():
                    count = lo - first + int(np.argmin(ok))
                    break
        if count >= _FREEZE_BLOCK or (count and self.grid is None):
            for lo in range(0, count, _BUILD_BLOCK):
                self._freeze(min(_BUILD_BLOCK, count - lo), eta, sigma, q)
        first = self.frozen
        eta_a = np.asarray(eta[first:n], dtype=float)
        q_a = np.asarray(q[first:n], dtype=float)
        w_a = self.recursion.weights(first, self.r, eta_a)
        tail = ETA * delta
        a_end = s * float(special.ndtri(tail)) - mu
        theta_min = math.sqrt(2.0 * (-math.log(tail) + 1.0)) / s
        grid = self.grid
        if grid is not None and self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
            if self._grow_shadow(grid, tail, s, mu, a_end, theta_min, eta, q):
                grid = self._take_shadow(eta, q)  # complete, and this grid is wearing out
                if grid is None or not self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
                    return self._after_failure(delta, tail, s, mu, a_end, theta_min, eta, q,
                                               q_a, w_a, accuracy)  # fmt: skip
                self.grid = grid
            if not answer:
                return None
            got = self._evaluate(grid, delta, s, mu, theta_min, tail, q_a, w_a, accuracy)
            if got is not None or self.n < self._retry_at:
                return got
            # the grid fits but no longer certifies the query (its margins are worn: the
            # aliasing error lifts the noise floor of p~ over a root): a new grid, once
        elif (grid is not None and grid.delta != delta) or self.n < self._retry_at:
            # another delta than the grid's, or a fresh grid failed not long ago: the caller
            # answers from scratch
            return None
        return self._after_failure(delta, tail, s, mu, a_end, theta_min, eta, q, q_a, w_a,
                                   accuracy)  # fmt: skip

    def _after_failure(
        self, delta: float, tail: float, s: float, mu: float, a_end: float, theta_min: float,
        eta: list[float], q: list[float], q_a: np.ndarray, w_a: np.ndarray, accuracy: float,
    ) -> tuple[float, float, int] | None:
        """The answer on a new grid: the shadow's if it certifies the query, else one built
        now (O(T M)); if even that one does not, no new grid is tried for a failed query
        until the run is twice as long (the caller answers from scratch meanwhile)."""
        grid = self._take_shadow(eta, q)
        if grid is None or not self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
            grid = self._build(delta, tail, s, mu, a_end, theta_min, eta, q)
        if grid is None or not self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
            self._retry_at = 2 * self.n
            return None
        self.grid = grid
        got = self._evaluate(grid, delta, s, mu, theta_min, tail, q_a, w_a, accuracy)
        if got is None:
            self._retry_at = 2 * self.n
        return got

    def _evaluate(
        self, grid: FrequencyGrid, delta: float, s: float, mu: float, theta_min: float,
        tail: float, q_a: np.ndarray, w_a: np.ndarray, accuracy: float,
    ) -> tuple[float, float, int] | None:
        """(upper, lower, frequencies) from the characteristic function on ``grid``, or None
        when it does not certify them within ``accuracy`` (module docstring)."""
        n = self.n
        m = math.ceil(theta_min / grid.step - 0.5) + 1
        theta, k = grid.theta[:m], grid.k[:m]
        t_re, t_im, _, _ = log_factors(w_a, q_a, grid.step, m)
        re_sum = t_re.sum(axis=1)
        log_phi = (grid.log_frozen()[:m] + grid.first[:m]
                   + (re_sum - 0.5 * (s * theta) ** 2)
                   + 1j * (t_im.sum(axis=1) - theta * mu))  # fmt: skip
        phi = np.exp(log_phi)
        step = grid.step
        span = grid.hi - grid.lo
        theta_m = (m + 0.5) * step
        ratio = math.exp(-s * s * step * theta_m)
        truncation = math.exp(-0.5 * (s * theta_m) ** 2) / (math.pi * (m + 0.5)) / (1.0 - ratio)
        size = (grid.size[:m] + (np.abs(t_im).sum(axis=1) - re_sum) + np.abs(grid.first[:m])
                + theta * abs(mu) + 0.5 * (s * theta) ** 2)  # fmt: skip
        w_top = self._weight_bound()
        age_a = self.r_age[-w_a.size :] if w_a.size else np.zeros(0)
        w_round = self.w_round + float(np.dot(g_q(q_a), _FP * (age_a + 4.0 + PHASOR_CHARGE) * w_a))
        rel = _FP * (size * (4.0 + PHASOR_CHARGE + 2.0 * math.log2(n + 1) + theta * w_top)
                     + math.log2(m + 1) + 4.0 + theta * span) + theta * w_round  # fmt: skip
        rel = rel + _FP * (self.syncs + 4.0) * grid.first_abs[:m]
        rel = rel + theta * (grid.drop_x + grid.w_round)
        abs_phi = np.abs(phi)
        rounding = float(np.sum(abs_phi * rel / k)) / math.pi
        big_r = 0.5 * theta * theta * self.quad[3]
        freeze_phi = np.exp(-0.5 * (s * theta) ** 2) * big_r * np.exp(big_r)
        freeze = float(np.sum(freeze_phi / k))
        error = 2.0 * tail + truncation + rounding + freeze / math.pi
        # the bound on abs(phi - exact phi) at each frequency (freezing and rounding)
        self.last = (theta, phi, s, mu, freeze_phi + abs_phi * rel)
        if not error < 1e-3 * delta:
            return None
        inv = Inversion()
        inv.set_parts(phi, step, s, mu, grid.lo, grid.hi, error)
        re, im = phi.real, phi.imag
        cos, sin = grid.cos[:, :m], grid.sin[:, :m]
        cdf = 0.5 - (cos @ (im / k) - sin @ (re / k)) / math.pi
        pdf = step / math.pi * (cos @ re + sin @ im)
        got = solve_epsilons(inv, delta, grid.xs, cdf, pdf, grid.hints)
        if got is None:
            return None
        upper, lower = got
        if not lower <= upper:
            return None
        if upper > 0 and (upper - lower) / upper > accuracy:
            return None
        return upper, lower, m

    def _fits(
        self, grid: FrequencyGrid, tail: float, s: float, mu: float, a_end: float, theta_min: float,
        q_a: np.ndarray, w_a: np.ndarray,
    ) -> bool:
        """Whether the grid's interval and frequencies still certify the query."""
        if a_end < grid.lo or math.ceil(theta_min / grid.step - 0.5) + 1 > grid.m:
            return False
        lam = grid.lam
        bound = self._weight_bound()
        if lam * bound > 700.0:
            return False
        # the frozen steps grew by c_t rho_t: expm1 grows by at most lam e^{lam bound} q c rho
        chern = grid.expm1 + lam * math.exp(lam * bound) * self.lin[0]
        chern += float(np.dot(q_a, np.expm1(lam * w_a)))
        b_end = (0.5 * lam * lam * s * s + chern - math.log(tail)) / lam - mu
        self._b_end = b_end
        return b_end <= grid.hi

    def _build(
        self, delta: float, tail: float, s: float, mu: float, a_end: float, theta_min: float,
        eta: list[float], q: list[float],
    ) -> FrequencyGrid | None:
        """A new grid with the frozen steps folded in (O(T M))."""
        self.rebuilds += 1
        n, beta, first = self.n, self.beta, self.frozen
        eta_all = np.asarray(eta[:n], dtype=float)
        q_now = np.asarray(q[:n], dtype=float)
        # the frozen steps are refrozen at their current weights w_t(T) (rho = 0): R_t(T) =
        # sum_{s=t..e-1} eta_s beta^(s-t) + beta^(e-t) R_e(T), a block [t0, e) at a time from
        # the newest back (R_frozen(T) the first carry), so that the temporaries are O(block)
        r_next, r_next_age = (float(self.r[0]), float(self.r_age[0])) if self.r.size else (0.0, 0.0)
        w_now = np.empty(n)
        carry = r_next
        for end in range(first, 0, -_BUILD_BLOCK):
            start = max(0, end - _BUILD_BLOCK)
            r_blk = self.recursion.discounted_rates(eta_all[start:end])
            if beta > 0.0:
                r_blk += carry * beta ** np.arange(end - start, 0, -1.0)
            carry = float(r_blk[0])
            w_now[start:end] = self.recursion.weights(start, r_blk, eta_all[start:end])
        w_now[first:] = self.recursion.weights(first, self.r, eta_all[first:])
        grid = new_grid(delta, tail, s, mu, a_end, theta_min, w_now, q_now, margin=GRID_MARGIN)
        if grid is None:
            return None
        self.shadow = None
        w_round, carries = 0.0, (4.0 if first > _BUILD_BLOCK else 0.0)
        for start in range(0, first, _BUILD_BLOCK):
            end = min(first, start + _BUILD_BLOCK)
            w_re, q_f = w_now[start:end], q_now[start:end]
            # growth coefficients (x beta for nesterov) a_t beta^(T + 1 - t), T + 1 = n (as in
            # _freeze)
            grid.fold(w_re, q_f, self.recursion.growth(start, end - start, n))
            # rounding of the refrozen weights: the backward filter loses about 2 ulps per
            # step, damped by beta (at most about 2 / (1 - beta), as the R_t of _sync), the
            # continuation from R_frozen(T) and a_t (nesterov: eta_t + beta a_t R_t) a few more;
            # each block's carry (the power, product and sum) about 3 ulps more, damped by
            # beta over each block: 4 more in all (none with a single block)
            age = np.zeros(end - start)
            if beta > 0.0:
                idx = np.arange(start, end, dtype=float)
                age = np.minimum(first - idx, 2.0 / (1.0 - beta) + 2.0) + r_next_age + carries
            w_round += float(np.dot(g_q(q_f), _FP * (age + 6.0 + PHASOR_CHARGE) * w_re))
        if first:
            grid.w_round = w_round
        return grid

    # -- the next grid, built ahead (no O(T M) rebuild at a query) ------------------------------

    def _grow_shadow(
        self, grid: FrequencyGrid, tail: float, s: float, mu: float, a_end: float,
        theta_min: float, eta: list[float], q: list[float],
    ) -> bool:
        """Start the next grid once this one has used ``_SHADOW_START`` of a margin (module
        docstring), or fold the next block of frozen steps into it; True when it is complete
        and this one has used ``_SHADOW_SWITCH`` of a margin (time to take it over)."""
        used = max((grid.a0 - a_end) / (grid.a0 - grid.lo),
                   (self._b_end - grid.b0) / (grid.hi - grid.b0))  # fmt: skip
        if self.shadow is not None:
            return self.shadow.fold_share(self.frozen, self.n, self.syncs, used, _SHADOW_SWITCH,
                                          eta, q)  # fmt: skip
        if used < _SHADOW_START or self.n < self._shadow_retry or self.frozen == 0:
            return False
        eta0 = np.asarray(eta[: self.n], dtype=float)
        r0 = self.recursion.discounted_rates(eta0)
        new = new_grid(grid.delta, tail, s, mu, a_end, theta_min, self.recursion.weights(0, r0, eta0),
                       np.asarray(q[: self.n], dtype=float), margin=GRID_MARGIN)  # fmt: skip
        if new is None:
            self._shadow_retry = 2 * self.n  # try again when the run is twice as long
        else:
            self.shadow = ShadowGrid(new, eta0, self.recursion, self.syncs, used)
        return False

    def _take_shadow(self, eta: list[float], q: list[float]) -> FrequencyGrid | None:
        """The shadow grid with every frozen step folded in (the rest of the steps before
        n0 now; those after n0 were folded as they froze), or None if there is none."""
        sh, self.shadow = self.shadow, None
        if sh is None:
            return None
        sh.fold_until(min(self.frozen, sh.n0), self.n, self.syncs, eta, q)
        if self.grid is not None:
            sh.grid.hints = self.grid.hints
        self.switches += 1
        return sh.grid
