"""The grid-free weighted heuristic of a growing SGD run, its characteristic function kept
up to date step by step (no O(T) work per query).

:mod:`.weighted_fourier` inverts the characteristic function of X = K + Z,

    phi(theta) = exp(-s^2 theta^2 / 2) prod_t f_t(theta),  f_t = 1 - q_t + q_t e^{i w_t(T) theta},

rebuilt at each query from all T weights: O(T M). Here (heavy-ball or nesterov SGD without
weight decay, one momentum beta, dampening d; ``optimizer_weights``) the weight of step t after
T steps is w_t(T) = a_t R_t(T) (nesterov: eta_t + beta a_t R_t(T)) with
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
the caller answers from scratch). Steps with q = 1/2 are never frozen; at q = 1, C = 0.

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

The next grid is built ahead, a block per query (the *shadow*): once the run has used half of
a margin of the grid (A or B at step T against their values when it was made), a grid for the
current run is made (an O(T) Chernoff bound) and the frozen steps are folded into it at their
current weights, R_t(T) = R_t(n0) + beta^(n0 - t) R_{n0}(T) with R_{n0}(T) kept step by step,
in shares sized to finish within half of the steps the margin is predicted to last; steps
frozen after it started are folded into both grids as they freeze. When the grid fails, the
shadow (its remaining steps folded then) takes over if it certifies the query, otherwise the
grid is rebuilt. A step refolded later has grown less since then than since it was frozen,
so E2 still bounds its remainder; its first-order terms and rounding are kept per grid.

Rounding is charged as in :mod:`.weighted_fourier` (8 machine epsilons per operation times
the size of every sum, the pairwise sums charged log2 of their length twice: the sums over
steps run along numpy's contiguous axis, where it sums pairwise, in blocks whose sums are
added pairwise: :mod:`.characteristic_grid`), plus the
rounding of the recursively kept weights (8 epsilons per update of R_t, times the weight)
and of the first-order vector (8 epsilons per update, times the sum of its magnitudes).

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
from scipy import signal, special

from opacus_lastiterate.analysis.last_iterate.characteristic_grid import (
    Q_HALF,
    FrequencyGrid,
    c_q,
    g_q,
    log_factors,
)
from opacus_lastiterate.analysis.last_iterate.fourier_roots import solve_epsilons
from opacus_lastiterate.analysis.last_iterate.weighted_fourier import (
    ETA,
    FP_CHARGE,
    MAX_TERMS,
    Inversion,
    chernoff_upper,
)

__all__ = ["FREEZE_ERROR", "GRID_MARGIN", "STATE_FORMAT", "IncrementalCharacteristic", "run_fingerprint"]

FREEZE_ERROR = 1e-5
"""Freezing adds at most about this times delta to the error bound (predicted)."""
GRID_MARGIN = 0.25
"""The grid's interval extends by this times its span on each side."""
RATE_SAFETY = 2.0  # later rates predicted <= RATE_SAFETY x the largest active one (freezing)
_FP = FP_CHARGE
_FREEZE_BLOCK = 16  # steps are frozen in blocks of at least this many (less work per query)
_SHADOW_START = 0.5  # the next grid is started when a margin of this one is half used
_SHADOW_BLOCK = 16  # frozen steps folded into it per query, at least
STATE_FORMAT = 2
"""Version of :meth:`IncrementalCharacteristic.state` (a state of another version is not
restored: the characteristic function is then rebuilt from the run)."""
_SCALARS = ("n", "frozen", "max_eta", "mu0", "s20", "w_round", "w_max", "syncs", "rebuilds",
            "switches", "_shadow_retry", "_b_end")  # fmt: skip


class _Shadow:
    """The next grid, started at step n0 and built a block of frozen steps per query (the
    steps 0..cursor-1 folded), at weights from R_t(n0) (``r0``, for t < n0) and
    R_{n0}(T) (``rho0``, kept up to date step by step)."""

    def __init__(
        self, grid: FrequencyGrid, n0: int, r0: np.ndarray, syncs0: int, used0: float
    ) -> None:
        self.grid, self.n0, self.r0, self.syncs0, self.used0 = grid, n0, r0, syncs0, used0
        self.rho0 = 0.0
        self.cursor = 0
        self.last_n = n0


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
        self.shadow: _Shadow | None = None  # the next grid, built a block per query
        self.switches = 0  # grids taken over from a shadow (not rebuilt at a query)
        self._shadow_retry = 0  # no shadow is started before this step (one failed to start)
        self._b_end = 0.0  # B of the run at the last query (from _fits)
        self._pw = np.ones(1)
        self.rebuilds = 0
        self.last: tuple[np.ndarray, np.ndarray, float, float, np.ndarray] | None = None
        """(theta, phi, s, mu, bound on abs(phi - exact phi)) of the last query (checks)."""

    # -- the run ----------------------------------------------------------------------------

    def _powers(self, n: int) -> np.ndarray:
        """beta^0 .. beta^n."""
        if self._pw.size <= n:
            self._pw = self.beta ** np.arange(2 * n + 2, dtype=float)
        return self._pw[: n + 1]

    def _a(self, first: int, n: int) -> np.ndarray:
        a = np.full(n, 1.0 - self.damp)
        if first == 0 and n:
            a[0] = 1.0
        return a

    def _weights(self, first: int, r: np.ndarray, eta: np.ndarray) -> np.ndarray:
        a = self._a(first, r.size)
        if self.nesterov:
            return eta + self.beta * a * r
        return a * r

    def _sync(self, eta: list[float]) -> None:
        """Take in the steps appended since the last call (module docstring)."""
        n_new = len(eta)
        add = n_new - self.n
        if add <= 0:
            return
        new = np.asarray(eta[self.n : n_new], dtype=float)
        self.max_eta = max(self.max_eta, float(new.max()))
        beta = self.beta
        if add == 1:
            r_new = new
        elif beta > 0.0:
            r_new = signal.lfilter([1.0], [1.0, -beta], new[::-1])[::-1]
        else:
            r_new = new.copy()
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
        sh = self.shadow
        if sh is not None:  # R_{n0}(T') = R_{n0}(T) + beta^(T - n0) R_{T+1}(T')
            sh.grid.advance(rho, decay)
            sh.rho0 += beta ** (self.n - sh.n0) * rho
        self.n = n_new
        self.syncs += 1

    def _freeze(self, count: int, eta: list[float], sigma: list[float], q: list[float]) -> None:
        """Freeze the ``count`` oldest active steps at their current weights."""
        first, t_now = self.frozen, self.n - 1
        idx = np.arange(first, first + count)
        r = self.r[:count]
        w = self._weights(first, r, np.asarray(eta[first : first + count]))
        a = self._a(first, count)
        c = (self.beta if self.nesterov else 1.0) * a * self.beta ** (t_now + 1.0 - idx)
        qq = np.asarray(q[first : first + count], dtype=float)
        s2 = np.asarray(sigma[first : first + count], dtype=float) ** 2
        self.mu0 += float(np.dot(qq, w))
        self.s20 += float(np.dot(s2, w * w))
        self.lin[1] += float(np.dot(qq, c))
        self.lin[3] += float(np.dot(2.0 * s2 * w, c))
        self.quad[2] += float(np.dot(s2, c * c))
        self.quad[5] += float(np.dot(c_q(qq), c * c))
        self.w_round += float(np.dot(g_q(qq), _FP * (self.r_age[:count] + 4.0) * w))
        self.w_max = max(self.w_max, float(w.max()))
        if self.grid is not None:
            self.grid.fold(w, qq, c)
        sh = self.shadow
        if sh is not None:  # steps appended since the shadow started: folded as they freeze
            k = first + count - max(first, sh.n0)
            if k > 0:
                sh.grid.fold(w[-k:], qq[-k:], c[-k:])
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
        sh = self.shadow
        out["shadow"] = None if sh is None else {
            "grid": sh.grid.as_dict(), "n0": sh.n0, "syncs0": sh.syncs0, "used0": sh.used0,
            "rho0": sh.rho0,
            "cursor": sh.cursor, "last_n": sh.last_n,
        }  # fmt: skip
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
                sh = state["shadow"]
                n0 = int(sh["n0"])
                ok = ok and 0 < n0 <= n and 0 <= int(sh["cursor"]) <= n0
                eta0 = np.asarray(eta[:n0], dtype=float)
                r0 = eta0 if char.beta == 0 else signal.lfilter(  # as when it was started
                    [1.0], [1.0, -char.beta], eta0[::-1])[::-1]  # fmt: skip
                char.shadow = _Shadow(FrequencyGrid.from_dict(sh["grid"]), n0, r0,
                                      int(sh["syncs0"]), float(sh["used0"]))  # fmt: skip
                char.shadow.rho0 = float(sh["rho0"])
                char.shadow.cursor, char.shadow.last_n = int(sh["cursor"]), int(sh["last_n"])
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return char if ok else None

    # -- a query ----------------------------------------------------------------------------

    def solve(
        self, delta: float, eta: list[float], sigma: list[float], q: list[float],
        accuracy: float,
    ) -> tuple[float, float, int] | None:
        """(upper, lower, frequencies) epsilon at ``delta`` for the run of the per-step lists
        (sigma_t > 0, q_t in (0, 1]), or None when not certified within ``accuracy``."""
        self._sync(eta)
        n = self.n
        if n == 0:
            return None
        first = self.frozen
        eta_a = np.asarray(eta[first:n], dtype=float)
        q_a = np.asarray(q[first:n], dtype=float)
        s2_a = np.asarray(sigma[first:n], dtype=float) ** 2
        w_a = self._weights(first, self.r, eta_a)
        lin, quad = self.lin, self.quad
        s2 = self.s20 + lin[2] + quad[0] + float(np.dot(s2_a, w_a * w_a))
        mu = self.mu0 + lin[0] + float(np.dot(q_a, w_a))
        if not s2 > 0.0:
            return None
        s = math.sqrt(s2)
        # freeze the leading active steps whose predicted share of E2 is small enough
        if self.beta > 0.0 and w_a.size:
            kappa = FREEZE_ERROR * delta * 2.0 * math.pi * s2 / n
            growth = RATE_SAFETY * float(eta_a.max()) / (1.0 - self.beta)
            age = (n - 1) - np.arange(first, n)
            c = (self.beta if self.nesterov else 1.0) * self._a(first, w_a.size)
            c = c * self.beta ** (age + 1.0) * growth
            ok = (c_q(q_a) * c * c <= kappa) & (np.abs(q_a - 0.5) > Q_HALF)
            count = w_a.size if ok.all() else int(np.argmin(ok))
        else:
            count = w_a.size  # beta = 0: the weights never change
        if count >= _FREEZE_BLOCK or (count and self.grid is None):
            self._freeze(count, eta, sigma, q)
            w_a, q_a, eta_a = w_a[count:], q_a[count:], eta_a[count:]
        tail = ETA * delta
        a_end = s * float(special.ndtri(tail)) - mu
        theta_min = math.sqrt(2.0 * (-math.log(tail) + 1.0)) / s
        grid = self.grid
        fits = grid is not None and self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a)
        if not fits:
            if grid is not None and grid.delta != delta:
                return None  # another delta than the grid's: the caller answers from scratch
            grid = self._take_shadow(eta, q)
            if grid is None or not self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
                grid = self._build(delta, tail, s, mu, a_end, theta_min, eta, q)
            if grid is None or not self._fits(grid, tail, s, mu, a_end, theta_min, q_a, w_a):
                return None
            self.grid = grid
        else:
            assert grid is not None
            self._grow_shadow(grid, tail, s, mu, a_end, theta_min, eta, q)
        m = math.ceil(theta_min / grid.step - 0.5) + 1
        theta, k = grid.theta[:m], grid.k[:m]
        t_re, t_im, _, _ = log_factors(w_a, q_a, theta)
        log_phi = (grid.log_frozen()[:m] + grid.first[:m]
                   + (t_re.sum(axis=1) - 0.5 * (s * theta) ** 2)
                   + 1j * (t_im.sum(axis=1) - theta * mu))  # fmt: skip
        phi = np.exp(log_phi)
        step = grid.step
        span = grid.hi - grid.lo
        theta_m = (m + 0.5) * step
        ratio = math.exp(-s * s * step * theta_m)
        truncation = math.exp(-0.5 * (s * theta_m) ** 2) / (math.pi * (m + 0.5)) / (1.0 - ratio)
        size = (grid.size[:m] + np.hypot(t_re, t_im).sum(axis=1) + np.abs(grid.first[:m])
                + theta * abs(mu) + 0.5 * (s * theta) ** 2)  # fmt: skip
        w_top = self._weight_bound()
        age_a = self.r_age[-w_a.size :] if w_a.size else np.zeros(0)
        w_round = self.w_round + float(np.dot(g_q(q_a), _FP * (age_a + 4.0) * w_a))
        rel = _FP * (size * (4.0 + 2.0 * math.log2(n + 1) + theta * w_top)
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
        # R_t(T) = sum_{s=t..frozen-1} eta_s beta^(s-t) + beta^(frozen-t) R_frozen(T)
        r_next, r_next_age = (float(self.r[0]), float(self.r_age[0])) if self.r.size else (0.0, 0.0)
        if beta > 0.0:
            r_all = signal.lfilter([1.0], [1.0, -beta], eta_all[:first][::-1])[::-1]
            if first:
                r_all = r_all + r_next * beta ** np.arange(first, 0, -1.0)
        else:
            r_all = eta_all[:first].copy()
        # the frozen steps are refrozen at their current weights w_t(T) (rho = 0), with growth
        # coefficients (x beta for nesterov) a_t beta^(T + 1 - t), T + 1 = n (as in _freeze)
        w_re = self._weights(0, r_all, eta_all[:first])
        q_f = np.asarray(q[:first], dtype=float)
        idx = np.arange(first, dtype=float)
        c_f = (beta if self.nesterov else 1.0) * self._a(0, first) * beta ** (n - idx)
        w_act = self._weights(first, self.r, eta_all[first:])
        w_now = np.r_[w_re, w_act]
        q_now = np.r_[q_f, np.asarray(q[first:n], dtype=float)]
        grid = self._new_grid(delta, tail, s, mu, a_end, theta_min, w_now, q_now)
        if grid is None:
            return None
        self.shadow = None
        if first:
            grid.fold(w_re, q_f, c_f)
            # rounding of the refrozen weights: the backward filter loses about 2 ulps per
            # step, damped by beta (at most about 2 / (1 - beta), as the R_t of _sync), the
            # continuation from R_frozen(T) and a_t (nesterov: eta_t + beta a_t R_t) a few more
            age = np.zeros(first)
            if beta > 0.0:
                age = np.minimum(first - idx, 2.0 / (1.0 - beta) + 2.0) + r_next_age
            grid.w_round = float(np.dot(g_q(q_f), _FP * (age + 6.0) * w_re))
        return grid

    def _new_grid(
        self, delta: float, tail: float, s: float, mu: float, a_end: float, theta_min: float,
        w_now: np.ndarray, q_now: np.ndarray,
    ) -> FrequencyGrid | None:
        """An empty grid for the run whose weights are ``w_now``: its interval [A, B] (the
        Chernoff bound at its best lambda), widened by ``GRID_MARGIN`` of its span on each
        side, and its frequencies."""
        keep = w_now > 0
        if not keep.any():
            return None
        try:
            b_unc, lam = chernoff_upper(w_now[keep], q_now[keep], s, tail)
        except (OverflowError, ValueError, FloatingPointError):
            return None
        b_end = b_unc - mu
        span = b_end - a_end
        if not (math.isfinite(span) and span > 0):
            return None
        lo, hi = a_end - GRID_MARGIN * span, b_end + GRID_MARGIN * span
        step = 2.0 * math.pi / (hi - lo)
        m = math.ceil(theta_min / step - 0.5) + 1
        if m > MAX_TERMS:
            return None
        # a little room for more frequencies (a smaller delta later at the same grid)
        grid = FrequencyGrid(delta, step, m + 2, lo, hi, lam)
        grid.a0, grid.b0 = a_end, b_end
        return grid

    # -- the next grid, built ahead (no O(T M) rebuild at a query) ------------------------------

    def _grow_shadow(
        self, grid: FrequencyGrid, tail: float, s: float, mu: float, a_end: float,
        theta_min: float, eta: list[float], q: list[float],
    ) -> None:
        """Start the next grid once this one has used half of a margin (module docstring),
        or fold the next block of frozen steps into it."""
        sh = self.shadow
        used = max((grid.a0 - a_end) / (grid.a0 - grid.lo),
                   (self._b_end - grid.b0) / (grid.hi - grid.b0))  # fmt: skip
        if sh is None:
            if used < _SHADOW_START or self.n < self._shadow_retry or self.frozen == 0:
                return
            n0, beta = self.n, self.beta
            eta0 = np.asarray(eta[:n0], dtype=float)
            r0 = signal.lfilter([1.0], [1.0, -beta], eta0[::-1])[::-1] if beta > 0 else eta0
            new = self._new_grid(grid.delta, tail, s, mu, a_end, theta_min,
                                 self._weights(0, r0, eta0), np.asarray(q[:n0], dtype=float))  # fmt: skip
            if new is None:
                self._shadow_retry = 2 * n0  # try again when the run is twice as long
                return
            self.shadow = _Shadow(new, n0, r0, self.syncs, used)
            return
        end = min(self.frozen, sh.n0)
        if sh.cursor < end:
            # the margin is used up at about (1 - used) / rate steps from now: fold the rest
            # within half of that, in shares proportional to the steps since the last query
            rate = (used - sh.used0) / max(1, self.n - sh.n0)
            left = (1.0 - used) / rate if rate > 0 else math.inf
            share = (self.n - sh.last_n) / max(1.0, 0.5 * left)
            count = max(_SHADOW_BLOCK, math.ceil(share * (end - sh.cursor)))
            self._fold_shadow(sh, min(end, sh.cursor + count), eta, q)
        sh.last_n = self.n

    def _fold_shadow(self, sh: _Shadow, stop: int, eta: list[float], q: list[float]) -> None:
        """Fold the frozen steps cursor..stop-1 (< n0) into the shadow at their current
        weights: R_t(T) = R_t(n0) + beta^(n0 - t) R_{n0}(T)."""
        lo, beta = sh.cursor, self.beta
        if stop <= lo:
            return
        t = np.arange(lo, stop, dtype=float)
        r = sh.r0[lo:stop] + sh.rho0 * beta ** (sh.n0 - t)
        w = self._weights(lo, r, np.asarray(eta[lo:stop], dtype=float))
        qq = np.asarray(q[lo:stop], dtype=float)
        c = (beta if self.nesterov else 1.0) * self._a(lo, stop - lo) * beta ** (self.n - t)
        sh.grid.fold(w, qq, c)
        # rounding: the filter's (as in _build), rho0's updates since n0, a_t, the sum
        age = np.minimum(sh.n0 - t, 2.0 / (1.0 - beta) + 2.0) if beta > 0 else np.zeros(t.size)
        age = age + (self.syncs - sh.syncs0) + 6.0
        sh.grid.w_round += float(np.dot(g_q(qq), _FP * age * w))
        sh.cursor = stop

    def _take_shadow(self, eta: list[float], q: list[float]) -> FrequencyGrid | None:
        """The shadow grid with every frozen step folded in (the rest of the steps before
        n0 now; those after n0 were folded as they froze), or None if there is none."""
        sh, self.shadow = self.shadow, None
        if sh is None:
            return None
        self._fold_shadow(sh, min(self.frozen, sh.n0), eta, q)
        if self.grid is not None:
            sh.grid.hints = self.grid.hints
        self.switches += 1
        return sh.grid
