"""A framework-free privacy monitor for Opacus training: epsilon for every step.

:class:`PrivacyMonitor` attaches to an Opacus ``DPOptimizer`` (the one ``make_private``
returned) and produces one :class:`EpsilonRecord` per optimizer step:

* ``heuristic_epsilon``: the last-iterate heuristic of the final model (not a DP guarantee
  for deep networks): every ``heuristic_every`` steps (default every step) for the
  constant-rate formula, every ``weighted_every`` steps (default 100) when a learning-rate
  schedule, momentum or weight decay makes the accountant use the weighted heuristic;
* ``robust_epsilon``: its certified maximum over suffixes (on the ``robust_every`` cadence,
  by default ``"auto"``: at those of steps 100, 200, 400, ... that fit in the monitor's
  overhead budget, and always at :meth:`PrivacyMonitor.finish`);
* ``standard_epsilon_rdp``: standard composition (all iterates released) from an RDP
  vector, converted with the min over orders: a cheap *upper bound* (every step);
* ``standard_epsilon_pld``: the tight standard epsilon, dp_accounting's PLD accountant
  (:class:`~opacus_lastiterate.analysis.baselines.composition.StandardComposition`) on the
  ``standard_every`` cadence (by default ``"auto"``, as above) and at the end;
* ``corrected_epsilon``: a normalisation accountant's epsilon (``"asgm"``/``"feasgm"``,
  ``docs/normalisation.md``) on the ``standard_every`` cadence, when one is monitored;
* ``lr``, ``noise_multiplier``, ``sample_rate`` of the step.

Fields not computed at a step are ``None``. Records go to *sinks*
(:mod:`opacus_lastiterate.callbacks.sinks`: logging, JSONL, CSV, TensorBoard, W&B, MLflow or
any callable). A :class:`PrivacyBudget` stops training *before* the step that would push a
chosen epsilon past a limit.

Recording and evaluation are separate (``docs/callbacks.md``, "Cost"). On the training hot
path the monitor only appends the step's (step, sigma, q, lr, SGD settings) to a queue: a few
Python floats that the accountant's hook has already read, no epsilon and no device
synchronisation. The epsilons are computed in batches by :meth:`PrivacyMonitor.flush`: every
``flush_every`` steps (after the update), at :meth:`~PrivacyMonitor.state_dict` (checkpoints)
and :meth:`~PrivacyMonitor.finish`, at the adapters' epoch ends, or when called. A batch
replays the queued steps, in order, into a private copy of the ``LastIterateAccountant``
(the *replica*) and asks it for epsilon after each step, as an accountant asked after every
step would be asked, so each logged value is the one the accountant reports at that step:
runs of queued steps with one constant-rate setting are solved together
(:meth:`IncrementalHeuristic.advance <opacus_lastiterate.analysis.last_iterate.incremental.IncrementalHeuristic.advance>`,
equal to the step-by-step values to about 1e-13 relative), and with ``weighted_every`` >= 50
the weighted heuristic is folded on a coarser grid (another upper bound within
``weight_accuracy``; ``docs/callbacks.md``, "Cost"). The RDP vectors of a batch are
composed and converted in one vectorised pass. With ``evaluation="process"`` the batches go
to a headless monitor in a separate Python process instead, which returns the same records
(``docs/callbacks.md``, "Evaluation in a separate process").

The budget guard is exact without evaluating every step: a step is allowed at once when a
certified upper bound is within the limit (the RDP standard epsilon, which bounds every
heuristic, and for the constant-rate heuristic the shifted-count bound of
:mod:`~opacus_lastiterate.analysis.last_iterate.budget_horizon`; both are computed for many
steps ahead and recomputed only when the settings change or the horizon is used up);
otherwise the queued steps are evaluated at once and the step's own value decides.

How it hooks in: Opacus calls ``optimizer.step_hook`` (the accountant's hook) inside
``DPOptimizer.pre_step``, after the noise is added and before the parameters change. The
monitor wraps that hook (the accountant records the step, then the monitor queues it and
checks the budget) and the wrapped optimizer's ``step`` (the update; a due flush follows
it). A step refused by the budget is taken back from the accountant and the update is not
applied. The monitor never reads a tensor (no ``.item()``, ``.cpu()``, ``.tolist()``).

Distributed training (Opacus's ``DistributedDPOptimizer`` under ``torch.distributed``):
create the monitor on every rank. Every rank's accountant records every step (each rank's
optimizer calls its hook with the same noise multiplier and sample rate), so the histories,
the epsilons and the budget guard's decisions are the same on every rank: a refused step is
refused everywhere, before the gradients' all-reduce for ``action="raise"`` and at the update
for ``action="stop"``, and no rank is left waiting in a collective. Only the sinks are
rank-dependent: by default they are called on rank 0 only (``sink_rank``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import numbers
import pickle
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from opacus_lastiterate.accountants.last_iterate import LastIterateAccountant, _Sweep
from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.analysis.last_iterate.budget_horizon import steps_within_limit
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    FINE_POINTS,
    SPARSE_FINE_POINTS,
)
from opacus_lastiterate.exceptions import MonitorWarning, PrivacyBudgetExceededError

__all__ = [
    "DOUBLING_START",
    "FIELDS",
    "LABELS",
    "BudgetMetric",
    "Cadence",
    "EpsilonRecord",
    "IncrementalRDP",
    "MonitorAudit",
    "MonitorWarning",
    "PrivacyBudget",
    "PrivacyBudgetExceededError",
    "PrivacyMonitor",
]

BudgetMetric = Literal["heuristic_epsilon", "robust_epsilon", "standard_epsilon_rdp"]
_BUDGET_METRICS: tuple[str, ...] = ("heuristic_epsilon", "robust_epsilon", "standard_epsilon_rdp")

LABELS: dict[str, str] = {
    "heuristic_epsilon": "last-iterate heuristic, final model only, not a DP guarantee",
    "robust_epsilon": "robust heuristic: certified max over the last t <= T steps",
    "standard_epsilon_rdp": "standard (all iterates), RDP upper bound (min over orders)",
    "standard_epsilon_pld": "standard (all iterates), dp_accounting PLD upper bound (tight)",
    "corrected_epsilon": "normalisation accountant (asgm/feasgm), docs/normalisation.md",
}
"""What each epsilon field of an :class:`EpsilonRecord` is."""


@dataclass(frozen=True)
class EpsilonRecord:
    """The privacy state after one optimizer step (``None``: not computed at this step)."""

    step: int
    delta: float
    heuristic_epsilon: float | None
    robust_epsilon: float | None
    standard_epsilon_rdp: float
    standard_epsilon_pld: float | None
    corrected_epsilon: float | None
    lr: float | None
    noise_multiplier: float
    sample_rate: float
    final: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in :data:`FIELDS` order."""
        return {f: getattr(self, f) for f in FIELDS}

    def epsilons(self) -> dict[str, float]:
        """The epsilon fields computed at this step."""
        return {k: v for k in LABELS if (v := getattr(self, k)) is not None}


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EpsilonRecord))
"""Field names of :class:`EpsilonRecord`, in order (the CSV header)."""


@runtime_checkable
class MonitorAudit(Protocol):
    """What the monitor needs from an in-training audit (``monitor.audit``): ``on_step``
    after every emitted record, ``finish`` once at :meth:`PrivacyMonitor.finish`; what
    ``finish`` returns is kept in :attr:`PrivacyMonitor.audit_result`."""

    def on_step(self, record: EpsilonRecord) -> None: ...

    def finish(self) -> Any: ...


@dataclass(frozen=True)
class PrivacyBudget:
    """Stop before the step that would push ``metric`` past ``epsilon``.

    Args:
        epsilon: the limit, > 0. A step is allowed if its epsilon is <= the limit.
        metric: ``"heuristic_epsilon"`` (default), ``"robust_epsilon"`` or
            ``"standard_epsilon_rdp"`` (the RDP upper bound on the standard epsilon, so the
            tight PLD value is within budget too). The metric is evaluated at a step only
            when no certified bound already keeps it within the limit (module docs); near
            the limit that is every step (20-75 ms per robust evaluation at large T, one
            weighted solve per step under a schedule or momentum).
        action: ``"raise"``: :class:`PrivacyBudgetExceededError` from ``optimizer.step()``;
            ``"stop"``: the step is skipped (no update), :attr:`PrivacyMonitor.should_stop`
            becomes True and every later step is skipped too (the adapters turn this into
            ``trainer.should_stop`` / ``control.should_training_stop``).
    """

    epsilon: float
    metric: BudgetMetric = "heuristic_epsilon"
    action: Literal["raise", "stop"] = "raise"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.epsilon, numbers.Real)
            or isinstance(self.epsilon, bool)
            or not (self.epsilon > 0)
        ):
            raise ValueError(f"`epsilon` must be a real number > 0, got {self.epsilon!r}.")
        if self.metric not in _BUDGET_METRICS:
            raise ValueError(f"`metric` must be one of {_BUDGET_METRICS}, got {self.metric!r}.")
        if self.action not in ("raise", "stop"):
            raise ValueError(f"`action` must be 'raise' or 'stop', got {self.action!r}.")


# -- cheap standard epsilon -----------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _per_step_rdp(
    noise_multiplier: float, sample_rate: float, orders: tuple[float, ...]
) -> np.ndarray:
    """RDP of one step at ``orders`` (read-only; shared by every monitor in the process:
    Opacus's ``compute_rdp`` costs about 65 ms per (sigma, q) for its default orders)."""
    if noise_multiplier == 0.0:
        vec = np.full(len(orders), np.inf)
    else:
        from opacus.accountants.analysis.rdp import compute_rdp

        vec = np.asarray(
            compute_rdp(
                q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(orders)
            ),
            dtype=float,
        )
    vec.setflags(write=False)
    return vec


class IncrementalRDP:
    """Standard composition by RDP: one vector over orders, added to once per step.

    The per-step RDP of the Poisson-subsampled Gaussian (Opacus's ``compute_rdp``, the
    Mironov et al. bound) is cached per distinct (sigma, q). The conversion to epsilon is
    the formula of Opacus's ``get_privacy_spent`` (min over orders), evaluated for many
    vectors at once with the same floating-point operations. An upper bound on the standard
    epsilon, looser than the PLD value.
    """

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        from opacus.accountants import RDPAccountant

        self.orders = np.asarray(
            RDPAccountant.DEFAULT_ALPHAS if orders is None else orders, dtype=float
        )
        self.rdp = np.zeros_like(self.orders)
        self._cache: dict[tuple[float, float], np.ndarray] = {}
        self._conversion: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self.previous = self.rdp

    def _per_step(self, noise_multiplier: float, sample_rate: float) -> np.ndarray:
        key = (noise_multiplier, sample_rate)
        vec = self._cache.get(key)
        if vec is None:
            vec = _per_step_rdp(noise_multiplier, sample_rate, tuple(self.orders.tolist()))
            self._cache[key] = vec
        return vec

    def add(self, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Compose ``steps`` more steps at (sigma, q)."""
        self.rdp = self.rdp + steps * self._per_step(noise_multiplier, sample_rate)

    def reset(self, history: Iterable[tuple[float, float, int]] = ()) -> None:
        """Start again from an Opacus history ``[(sigma, q, steps), ...]``."""
        self.rdp = np.zeros_like(self.orders)
        for sigma, q, steps in history:
            self.add(float(sigma), float(q), int(steps))

    def _rows(self, steps: Sequence[tuple[float, float]], extra: int = 0,
              last: tuple[float, float] | None = None) -> np.ndarray:
        """The vectors after each of ``steps`` and then ``extra`` steps at ``last``: the
        running sums, added one step at a time as :meth:`add` does (row 0 is the current
        vector)."""
        vectors = [self.rdp] + [self._per_step(s, q) for s, q in steps]
        if extra:
            assert last is not None
            vectors.append(np.broadcast_to(self._per_step(*last), (extra, self.orders.size)))
        return np.cumsum(np.vstack(vectors), axis=0)

    def epsilons(self, rows: np.ndarray, delta: float) -> np.ndarray:
        """Epsilon of each RDP vector (row) at ``delta``: min over orders of
        rdp - (log(delta) + log(a)) / (a - 1) + log((a - 1) / a); 0 for a zero vector,
        inf for one with an infinite entry."""
        conv = self._conversion.get(delta)
        if conv is None:
            a = self.orders
            conv = self._conversion[delta] = (
                (np.log(delta) + np.log(a)) / (a - 1),
                np.log((a - 1) / a),
            )
        rows = np.atleast_2d(rows)
        with np.errstate(invalid="ignore"):
            eps = (rows - conv[0]) + conv[1]
        finite = np.all(np.isfinite(rows), axis=1)
        out = np.full(rows.shape[0], math.inf)
        if np.any(finite):
            out[finite] = np.nanmin(eps[finite], axis=1)
        out[~np.any(rows, axis=1)] = 0.0
        return out

    def epsilon(self, delta: float) -> float:
        """Epsilon of the current vector (0 before any step)."""
        return float(self.epsilons(self.rdp, delta)[0])

    def advance(self, steps: Sequence[tuple[float, float]], delta: float) -> np.ndarray:
        """Compose ``steps`` [(sigma, q), ...] one by one; the epsilon after each
        (:attr:`previous`: the vector before the last of them)."""
        rows = self._rows(steps)
        self.previous = rows[-2].copy()
        self.rdp = rows[-1].copy()
        return self.epsilons(rows[1:], delta)

    def lookahead(
        self,
        steps: Sequence[tuple[float, float]],
        extra: int,
        last: tuple[float, float],
        delta: float,
    ) -> np.ndarray:
        """The epsilon after each of ``steps`` and then ``extra`` steps at ``last``, as
        :meth:`advance` would compute them, without composing them."""
        return self.epsilons(self._rows(steps, extra, last)[1:], delta)


# -- the replica of the accountant ----------------------------------------------------------


class _RecordedSGD:
    """The optimizer as the replica reads it when a queued step is replayed: the SGD
    settings the accountant's hook read at that step (``sgd_settings`` reads
    ``param_groups``; the class is named ``SGD`` for ``check_optimizer_supported``)."""

    __slots__ = ("param_groups",)

    def __init__(self, settings: tuple[float, float, float, bool, float]) -> None:
        lr, momentum, dampening, nesterov, weight_decay = settings
        self.param_groups = [
            {
                "lr": lr,
                "momentum": momentum,
                "dampening": dampening,
                "nesterov": nesterov,
                "weight_decay": weight_decay,
            }
        ]


_RecordedSGD.__name__ = "SGD"

Settings = tuple[float, float, float, bool, float] | None

Cadence = int | Literal["doubling", "auto"] | None
"""How often a value is computed: every k steps, ``"doubling"`` (at steps 100, 200, 400, 800,
...: the total cost of a value that grows with T stays within about twice its cost at the
end), ``"auto"`` (``robust_every`` and ``standard_every`` only: at those doubling steps that
fit in the monitor's ``max_overhead``), or None (only at
:meth:`PrivacyMonitor.finish`)."""

DOUBLING_START = 100
"""First step of the ``"doubling"`` cadence."""

_clock = time.perf_counter  # the overhead budget's clock (a module name: tests replace it)


class _OverheadBudget:
    """The wall-clock budget of the ``"auto"`` cadence: a value due at a doubling step is
    computed when the seconds spent on such values so far, plus the value's last cost, stay
    within ``fraction`` of the training time since the monitor was attached (wall time less
    those seconds). Before a value was first timed its cost is taken as ``PRIOR``; its cost
    can grow with T, so the budget is kept to within that growth, not exactly."""

    # seconds, until measured (measured: a robust search 2-40 ms, a PLD epsilon 0.05-0.5 s)
    PRIOR: ClassVar[Mapping[str, float]] = {"robust": 0.01, "standard": 0.1}

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.cost = dict(self.PRIOR)
        self.restart()

    def restart(self) -> None:
        """Count the training time from now (at attach and at a restored state)."""
        self.start = _clock()
        self.spent = 0.0

    def allows(self, kind: str) -> bool:
        training = _clock() - self.start - self.spent
        return self.spent + self.cost[kind] <= self.fraction * training

    def charge(self, kind: str, seconds: float) -> None:
        self.cost[kind] = seconds
        self.spent += seconds


_MIN_RUN = 4  # queued steps of one setting replayed together (fewer: one by one)
_SPARSE_CADENCE = 50  # weighted_every from which the replica's weighted grid is coarser


class _Replica(LastIterateAccountant):
    """A :class:`LastIterateAccountant` that the monitor feeds with queued steps, each
    followed by the same queries an accountant asked after every step receives."""

    @classmethod
    def of(
        cls,
        accountant: LastIterateAccountant,
        state: Mapping[str, Any] | None = None,
        fine_points: float = FINE_POINTS,
    ) -> _Replica:
        """A replica of ``accountant`` at ``state`` (default: its current state), whose
        weighted engine uses ``fine_points`` (``incremental_weighted``)."""
        replica = cls()
        replica.weight_accuracy = accountant.weight_accuracy
        replica._weighted_fine_points = fine_points
        replica.load_state_dict(accountant.state_dict() if state is None else state)
        return replica

    def replay(self, sigma: float, q: float, settings: Settings) -> None:
        """Record a step as the accountant's hook did (``settings`` None: the accountant
        had no usable optimizer settings for it)."""
        if settings is None:
            if not self._trace_disabled:
                self._trace_disabled, self._trace, self._summary = True, [], None
        elif not self._trace_disabled:
            self._record_optimizer(_RecordedSGD(settings))
        self._record(sigma, q)

    def replay_constant(
        self, sigma: float, q: float, settings: Settings, count: int, delta: float
    ) -> np.ndarray | None:
        """Record ``count`` steps at (sigma, q) with ``settings`` and return the heuristic
        epsilon at ``delta`` after each: the values that :meth:`replay` and ``get_epsilon``
        step by step give (to the root finder's tolerance, about 1e-13 relative), solved
        together (:meth:`IncrementalHeuristic.advance`). The same warnings are given. None,
        with nothing recorded, where only the step-by-step path applies: noise 0, the
        weighted heuristic, settings that would leave the constant-rate formula, a history
        assigned from outside, or a monotonicity check that is not the single-segment one
        with nothing left to sweep."""
        if not (
            sigma > 0.0
            and not self._externally_assigned
            and not self._weights_in_use()
            and self.stays_constant_rate(settings)
        ):
            return None
        sweep = None
        if delta not in self._monotone_warned:  # get_epsilon's check still runs
            segments = self._segments
            if segments and not (
                len(segments) == 1
                and segments[0].noise_multiplier == sigma
                and segments[0].sample_rate == q
            ):
                return None  # several segments: the spread-out search of every query
            sweep = self._sweeps.get(delta)
            if sweep is None:  # as the first get_epsilon call makes it
                sweep = self._sweeps[delta] = _Sweep(limit=self._num_steps + 1)
            if not sweep.exhausted:
                return None  # shorter runs still to evaluate, two per query
        if settings is None:
            if not self._trace_disabled:
                self._trace_disabled, self._trace, self._summary = True, [], None
        elif not self._trace_disabled:
            self._append_settings(settings, count)
        self._extend_segments(sigma, q, count)
        self._weighted_engine = None  # rebuilt from the trace if ever needed
        peak = self._engine.suffix_peak(delta)
        eps = self._engine.advance(sigma, q, count, delta)
        if sweep is not None:  # get_epsilon's single-segment check, every step at once
            best = np.maximum.accumulate(eps)
            if peak is not None:
                best = np.maximum(best, peak.epsilon)
            best = np.maximum(best, sweep.best)
            low = np.flatnonzero(eps < best * (1.0 - 1e-9))
            if low.size:
                j = int(low[0])
                first = int(np.argmax(eps[: j + 1]))
                best_t, value = self._num_steps - count + 1 + first, float(eps[first])
                if peak is not None and peak.epsilon >= value:
                    best_t, value = peak.steps, peak.epsilon
                if sweep.best > value:
                    best_t, value = sweep.best_steps, sweep.best
                self._warn_non_monotone(
                    delta, float(eps[j]), self._num_steps - count + 1 + j, best_t, value
                )
        return eps

    @property
    def weighted(self) -> bool:
        """Whether get_epsilon answers with the weighted heuristic now."""
        return self._weights_in_use()

    def stays_constant_rate(self, settings: Settings) -> bool:
        """Whether more steps with ``settings`` keep the constant-rate formula."""
        if self._weights_in_use():
            return False
        if settings is None or self._trace_disabled:
            return True
        steps, _ = self._trace_summary()
        if steps != self._steps():  # the trace does not cover the run
            return True
        lr, momentum, _, _, weight_decay = settings
        same_rate = not self._trace or self._trace[-1][0] == lr
        return momentum == 0.0 and weight_decay == 0.0 and same_rate

    def drop_last_step(self) -> None:
        self.load_state_dict(_drop_last_step(self.state_dict()))


# -- helpers --------------------------------------------------------------------------------


def _check_cadence(
    name: str, value: object, *, doubling: bool = True, auto: bool = False
) -> Any:
    if value is None or (doubling and value == "doubling") or (auto and value == "auto"):
        return value
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        allowed = (', "doubling"' if doubling else "") + (', "auto"' if auto else "")
        raise ValueError(f"`{name}` must be an integer >= 1{allowed} or None, got {value!r}.")
    return int(value)


def _due(step: int, every: Cadence) -> bool:
    """Whether a value with cadence ``every`` is computed at ``step``: every k steps, or at
    steps DOUBLING_START * 2^j (``"doubling"``; ``"auto"``: those of them that the overhead
    budget also allows), or never (None: only at ``finish``)."""
    if every is None:
        return False
    if every == "doubling" or every == "auto":
        blocks, rest = divmod(step, DOUBLING_START)
        return rest == 0 and blocks > 0 and blocks & (blocks - 1) == 0
    return step % every == 0


def _host_float(value: object) -> float | None:
    """A learning rate as a float without a device synchronisation (None for a CUDA tensor)."""
    if isinstance(value, numbers.Real):
        return float(value)
    device = getattr(value, "device", None)
    if device is not None and getattr(device, "type", "cpu") == "cpu":
        return float(value)  # type: ignore[arg-type]
    return None


def _drop_last_step(state: Mapping[str, Any]) -> dict[str, Any]:
    """An accountant state with its last recorded step removed (history and trace)."""
    out = dict(state)
    history = [tuple(h) for h in out["history"]]
    sigma, q, steps = history[-1]
    history[-1:] = [(sigma, q, steps - 1)] if steps > 1 else []
    out["history"] = history
    trace = out.get("optimizer_trace")
    if trace:
        trace = [tuple(e) for e in trace]
        *key, n = trace[-1]
        trace[-1:] = [(*key, n - 1)] if n > 1 else []
        out["optimizer_trace"] = trace
    return out


def _drop_last_steps(state: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """An accountant state with its last ``steps`` recorded steps removed."""
    out = dict(state)
    for _ in range(steps):
        out = _drop_last_step(out)
    return out


def _extend(history: list[list[Any]], sigma: float, q: float) -> None:
    """One more step in a run-length history [[sigma, q, steps], ...]."""
    if history and history[-1][0] == sigma and history[-1][1] == q:
        history[-1][2] += 1
    else:
        history.append([sigma, q, 1])


def _last_step(accountant: Any) -> tuple[float, float]:
    """(sigma, q) of the last recorded step, without copying the history."""
    segments = getattr(accountant, "_segments", None)
    if segments is not None:  # a RunAccountant (its .history is a copy)
        return segments[-1].noise_multiplier, segments[-1].sample_rate
    sigma, q, _ = accountant.history[-1]
    return float(sigma), float(q)


def _num_steps(accountant: Any) -> int:
    steps = getattr(accountant, "num_steps", None)
    if isinstance(steps, int):
        return steps
    return int(sum(h[2] for h in accountant.history))


def _process_rank() -> int:
    """This process's ``torch.distributed`` rank; 0 without an initialised process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def _check_sink_rank(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise ValueError(f"`sink_rank` must be an integer >= 0 or None, got {value!r}.")
    return int(value)


def _resolve_accountant(source: object) -> Any:
    from opacus.accountants import IAccountant

    accountant = getattr(source, "accountant", source)  # a PrivacyEngine has .accountant
    if not isinstance(accountant, IAccountant):
        raise TypeError(
            "`accountant` must be an Opacus accountant or a PrivacyEngine, got "
            f"{type(source).__name__}."
        )
    return accountant


Sink = Callable[[EpsilonRecord], None]
# a queued step: (step, sigma, q, lr, SGD settings)
_Queued = tuple[int, float, float, float | None, Settings]

_RDP_BLOCK = (256, 8192)  # first and largest number of steps the RDP horizon looks ahead
_BOUND_STEPS = 4096  # the most steps one shifted-count bound certifies
_BOUND_RETRY = 16  # steps of exact checks before the shifted-count bound is tried again
_SLACK = 1e-6  # relative margin between a certified bound and the limit


# -- the monitor ----------------------------------------------------------------------------


class PrivacyMonitor:
    """Per-step privacy record of DP-SGD training (module docs).

    Args:
        accountant: the ``PrivacyEngine`` (its ``.accountant``) or the accountant that
            ``make_private`` attached to the optimizer. With a ``LastIterateAccountant`` the
            heuristic (and robust) epsilon is recorded; with ``"asgm"``/``"feasgm"`` its
            value is the corrected epsilon; with any other Opacus accountant only the
            standard epsilons.
        delta: target delta, in (0, 1).
        sinks: where records go: objects of :mod:`~opacus_lastiterate.callbacks.sinks` or
            any callable taking an :class:`EpsilonRecord`.
        heuristic_every: compute ``heuristic_epsilon`` every k steps while the accountant
            uses the constant-rate formula (and at :meth:`finish`); a :data:`Cadence`.
        weighted_every: the same while it uses the weighted heuristic (a learning-rate
            schedule, momentum or weight decay: one weighted solve per evaluation).
        robust_every: when to compute ``robust_epsilon`` (a certified search, tens of ms
            at large T), besides :meth:`finish`; default ``"auto"``: at the steps 100, 200,
            400, ... (``"doubling"``) that fit in ``max_overhead``.
        standard_every: when to compute ``standard_epsilon_pld`` and ``corrected_epsilon``
            (a PLD composition, 0.05-0.5 s), besides :meth:`finish`; default ``"auto"``.
        max_overhead: the ``"auto"`` cadences' budget, a fraction in (0, 1] of the wall
            time since :meth:`attach` (default 0.01): a robust or PLD value due at a
            doubling step is computed only when the time spent on such values, with its
            last cost, stays within it (``docs/callbacks.md``, "Cost"). Which steps carry
            them then depends on the machine's speed; the final record always does. With
            ``evaluation="process"`` the values are computed off the training thread and
            ``"auto"`` is ``"doubling"``.
        flush_every: evaluate the queued steps and send their records to the sinks every k
            steps; None: only at :meth:`flush`, :meth:`state_dict`, :meth:`finish` and the
            adapters' epoch ends.
        corrected_accountant: a configured ``ASGMAccountant``/``FEASGMAccountant`` that the
            monitor feeds every step alongside ``accountant`` (through its own hook).
        budget: a :class:`PrivacyBudget`, or None for no limit.
        audit: an object with ``on_step(record)`` and ``finish()`` (:class:`MonitorAudit`),
            e.g. an in-training canary audit.
        optimizer: if given, :meth:`attach` to it now.
        sink_rank: under ``torch.distributed``, the rank whose process calls the sinks
            (default 0); the other ranks still account, build the records, check the budget
            and call the audit, identically. A process without an initialised process group
            counts as rank 0. None: call the sinks on every rank.
        evaluation: ``"inline"`` (default): the records are computed on the training
            thread, at each flush; ``"process"``: in a separate Python process (another
            core), fed at each flush, so that the evaluation leaves the training thread
            (``docs/callbacks.md``, "Evaluation in a separate process"). The records are the
            same floats (up to the last bits of BLAS sums: the process is single-threaded);
            they are emitted at the flush after they come back (at :meth:`state_dict` and
            :meth:`finish`, all of them). The process starts in the
            background (seconds of imports, :meth:`wait_ready`); if it fails, the monitor
            evaluates inline from then on, with one :class:`MonitorWarning`. Not with a
            ``budget``.
    """

    def __init__(
        self,
        accountant: object,
        *,
        delta: float,
        sinks: Iterable[Sink] = (),
        heuristic_every: Cadence = 1,
        weighted_every: Cadence = 100,
        robust_every: Cadence = "auto",
        standard_every: Cadence = "auto",
        max_overhead: float = 0.01,
        flush_every: int | None = 100,
        corrected_accountant: object = None,
        budget: PrivacyBudget | None = None,
        audit: MonitorAudit | None = None,
        optimizer: object = None,
        sink_rank: int | None = 0,
        evaluation: Literal["inline", "process"] = "inline",
    ) -> None:
        from opacus_lastiterate.accountants.normalisation import (
            ASGMAccountant,
            FEASGMAccountant,
        )

        self.accountant = _resolve_accountant(accountant)
        self.delta = check_delta(delta)
        self.sinks: list[Sink] = []
        for i, sink in enumerate(sinks):
            if not callable(sink):
                raise TypeError(f"`sinks[{i}]` must be callable, got {type(sink).__name__}.")
            self.sinks.append(sink)
        self.sink_rank = _check_sink_rank(sink_rank)
        self.heuristic_every = _check_cadence("heuristic_every", heuristic_every)
        self.weighted_every = _check_cadence("weighted_every", weighted_every)
        self.robust_every = _check_cadence("robust_every", robust_every, auto=True)
        self.standard_every = _check_cadence("standard_every", standard_every, auto=True)
        overhead: object = max_overhead  # any real number (numpy's too), not a bool
        if (
            not isinstance(overhead, numbers.Real)
            or isinstance(overhead, bool)
            or not 0.0 < float(overhead) <= 1.0
        ):
            raise ValueError(f"`max_overhead` must be a number in (0, 1], got {max_overhead!r}.")
        self._overhead = _OverheadBudget(float(overhead))
        self.flush_every = _check_cadence("flush_every", flush_every, doubling=False)
        normalisation = (ASGMAccountant, FEASGMAccountant)
        if corrected_accountant is not None and not isinstance(corrected_accountant, normalisation):
            raise TypeError(
                "`corrected_accountant` must be an ASGMAccountant or FEASGMAccountant, got "
                f"{type(corrected_accountant).__name__}."
            )
        if corrected_accountant is None and isinstance(self.accountant, normalisation):
            self._corrected: Any = self.accountant
        else:
            self._corrected = corrected_accountant
        self._own_corrected = self._corrected is not None and self._corrected is not self.accountant
        if budget is not None and not isinstance(budget, PrivacyBudget):
            raise TypeError(f"`budget` must be a PrivacyBudget or None, got {budget!r}.")
        self._heuristic = isinstance(self.accountant, LastIterateAccountant)
        if budget is not None and budget.metric != "standard_epsilon_rdp" and not self._heuristic:
            raise ValueError(
                f"`budget.metric` {budget.metric!r} needs a LastIterateAccountant; the "
                f"accountant is a {type(self.accountant).__name__} (use "
                "'standard_epsilon_rdp')."
            )
        if audit is not None and not isinstance(audit, MonitorAudit):
            raise TypeError("`audit` must have on_step(record) and finish() methods.")
        if evaluation not in ("inline", "process"):
            raise ValueError(f"`evaluation` must be 'inline' or 'process', got {evaluation!r}.")
        if evaluation == "process" and budget is not None:
            raise ValueError(
                "`evaluation='process'` cannot be used with a `budget`: the budget guard needs "
                "the exact value of a step on the training thread, before its update; use "
                "evaluation='inline'."
            )
        self.evaluation = evaluation
        self._worker: Any = None  # the EvaluationWorker of evaluation="process"
        self._worker_failed = False
        self.budget = budget
        self.audit = audit
        self.audit_result: Any = None
        self.records_emitted = 0
        self.last_record: EpsilonRecord | None = None
        """The last record sent to the sinks (records are sent when they are flushed)."""
        self.should_stop = False
        """True once the budget refused a step (``action="stop"``)."""
        self.stop_reason: str | None = None
        self._rdp = IncrementalRDP()
        self._skip_update = False
        self._optimizer: Any = None
        self._inner_hook: Callable[[Any], None] | None = None
        self._sync()
        if optimizer is not None:
            self.attach(optimizer)

    def _sync(self, rdp: Sequence[float] | None = None) -> None:
        """Start evaluating from the accountant's current state (no queued steps)."""
        acc = self.accountant
        self._replica: _Replica | None = (
            _Replica.of(acc, fine_points=self._weighted_grid) if self._heuristic else None
        )
        self._history: list[list[Any]] = [list(h) for h in acc.history]
        self._evaluated = _num_steps(acc)
        self._final: tuple[int, EpsilonRecord | None] | None = None  # (steps, record) of finish()
        if rdp is not None and len(rdp) == self._rdp.orders.size:
            self._rdp.rdp = np.asarray(rdp, dtype=float)
        else:
            self._rdp.reset(acc.history)
        self._queue: list[_Queued] = []
        self._ready: list[EpsilonRecord] = []
        self._last_lr: float | None = None if self.last_record is None else self.last_record.lr
        self._reset_horizons()
        # evaluation="process": batches sent and not answered, with the RDP vector and the
        # learning rate before each; warnings raised in the worker, to re-issue
        self._in_flight: list[tuple[list[_Queued], np.ndarray, float | None]] = []
        self._worker_warnings: list[tuple[str, type[Warning]]] = []
        if self.evaluation == "process":
            self._stop_worker(kill=True)  # its answers are of the state replaced
            self._start_worker()

    def _reset_horizons(self) -> None:
        self._rdp_horizon: tuple[tuple[float, float], int] | None = None
        self._rdp_block = _RDP_BLOCK[0]
        self._rdp_spent = False  # the RDP bound exceeded the limit (it never comes back)
        self._bound_horizon: tuple[Settings, int] | None = None
        self._bound_retry_at = 0
        self._bound_start = 16

    # -- attaching ------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        """This process's ``torch.distributed`` rank (0 without a process group)."""
        return _process_rank()

    @property
    def calls_sinks(self) -> bool:
        """Whether this process calls the sinks (``sink_rank`` None or this rank)."""
        return self.sink_rank is None or _process_rank() == self.sink_rank

    @property
    def attached(self) -> bool:
        """Whether the monitor is attached to an optimizer."""
        return self._optimizer is not None

    @property
    def num_steps(self) -> int:
        """Steps recorded by the accountant (queued ones included)."""
        return _num_steps(self.accountant)

    @property
    def pending(self) -> int:
        """Steps recorded whose records have not been sent to the sinks yet."""
        sent = sum(len(b[0]) for b in self._in_flight) if self._in_flight else 0
        return len(self._queue) + len(self._ready) + sent

    def attach(self, optimizer: object) -> PrivacyMonitor:
        """Wrap the accountant's hook of an Opacus ``DPOptimizer`` (``make_private``'s).

        Raises:
            TypeError: if ``optimizer`` is not a ``DPOptimizer``.
            ValueError: if it has no step hook (no accountant attached) or the monitor is
                attached already.
        """
        from opacus.optimizers import DPOptimizer

        if not isinstance(optimizer, DPOptimizer):
            raise TypeError(
                "`optimizer` must be the Opacus DPOptimizer returned by make_private, got "
                f"{type(optimizer).__name__}."
            )
        if self._optimizer is not None:
            if self._optimizer is optimizer:
                return self
            raise ValueError("this PrivacyMonitor is attached to another optimizer already.")
        if getattr(optimizer, "_privacy_monitor", None) is not None:
            raise ValueError("`optimizer` has a PrivacyMonitor attached already.")
        if optimizer.step_hook is None:
            raise ValueError(
                "`optimizer` has no step hook: make_private attaches the accountant's hook; "
                "a monitor needs it to follow the accountant."
            )
        if not self._queue and self._evaluated != _num_steps(self.accountant):
            self._sync()  # the accountant moved on without the monitor
        self._inner_hook = optimizer.step_hook
        optimizer.step_hook = self._on_pre_step  # type: ignore[assignment]
        inner = optimizer.original_optimizer
        inner_step = inner.step

        def step(*args: Any, **kwargs: Any) -> Any:
            return self._on_update(inner_step, *args, **kwargs)

        inner.step = step  # instance attribute: DPOptimizer.step calls original_optimizer.step()
        optimizer._privacy_monitor = self  # type: ignore[attr-defined]
        self._optimizer = optimizer
        self._overhead.restart()
        return self

    def detach(self) -> None:
        """Flush, then undo :meth:`attach` (the accountant's hook is restored)."""
        opt = self._optimizer
        if opt is None:
            return
        self.flush()
        opt.step_hook = self._inner_hook
        opt.original_optimizer.__dict__.pop("step", None)
        opt._privacy_monitor = None
        self._optimizer = None

    # -- per step: the hot path -------------------------------------------------------------

    def _on_pre_step(self, optim: Any) -> None:
        """The wrapped step hook: the accountant records the step, the monitor queues it
        and checks the budget. No epsilon is computed here unless the budget needs it."""
        if self.should_stop:
            self._skip_update = True
            return
        assert self._inner_hook is not None
        self._inner_hook(optim)
        acc = self.accountant
        sigma, q = _last_step(acc)
        if self._own_corrected:  # what its own hook would record: the same (sigma, q)
            self._corrected._observe(optim)
            self._corrected._record(sigma, q)
        settings: Settings = None
        if self._replica is not None and not acc._trace_disabled and acc._trace:
            settings = acc._trace[-1][:5]
        entry = (
            _num_steps(acc),
            sigma,
            q,
            _host_float(optim.param_groups[0].get("lr")),
            settings,
        )
        self._queue.append(entry)
        if self.budget is not None:
            self._check_budget(entry)

    def _on_update(self, inner_step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._skip_update:
            self._skip_update = False
            return None
        out = inner_step(*args, **kwargs)
        backlog = len(self._queue) if self._worker is not None else self.pending
        if self.flush_every is not None and backlog >= self.flush_every:
            self.flush()
        return out

    # -- the budget guard -----------------------------------------------------------------

    def _rdp_limit(self) -> float:
        """The RDP epsilon that certifies the budget: the limit itself for the RDP metric;
        below it by the weighted heuristic's accuracy (its values are rounded up by at most
        that) and a margin for the heuristics, which the RDP standard epsilon bounds (the
        final model is a post-processing of all iterates)."""
        assert self.budget is not None
        limit = self.budget.epsilon
        if self.budget.metric == "standard_epsilon_rdp":
            return limit
        accuracy = self._replica.weight_accuracy if self._replica is not None else 0.0
        return limit * (1.0 - accuracy) * (1.0 - _SLACK)

    def _rdp_allows(self, step: int, sigma: float, q: float) -> bool:
        """Whether the RDP bound certifies ``step`` (O(1) inside the horizon)."""
        if self._rdp_spent:
            return False
        horizon = self._rdp_horizon
        if horizon is not None and horizon[0] == (sigma, q) and step <= horizon[1]:
            return True
        queued = [(s, qq) for _, s, qq, _, _ in self._queue]
        eps = self._rdp.lookahead(queued, self._rdp_block, (sigma, q), self.delta)
        over = np.flatnonzero(~(eps <= self._rdp_limit()))
        safe = int(over[0]) if over.size else eps.size  # rows 0..safe-1 are within the limit
        end = self._evaluated + safe
        if not over.size:
            self._rdp_block = min(2 * self._rdp_block, _RDP_BLOCK[1])
        if step > end:
            self._rdp_spent = True
            return False
        self._rdp_horizon = ((sigma, q), end)
        return True

    def _bound_allows(self, step: int, sigma: float, settings: Settings) -> bool:
        """Whether the shifted-count bound certifies ``step`` for the constant-rate
        heuristic (:mod:`~opacus_lastiterate.analysis.last_iterate.budget_horizon`)."""
        horizon = self._bound_horizon
        if horizon is not None and horizon[0] == settings and sigma > 0 and step <= horizon[1]:
            return True
        replica = self._replica
        if replica is None or step < self._bound_retry_at or self._evaluated == 0:
            return False
        if not all(s > 0 and st == settings for _, s, _, _, st in self._queue):
            return False
        if not replica.stays_constant_rate(settings):
            return False
        assert self.budget is not None
        m = steps_within_limit(
            [tuple(h) for h in self._history],
            self.delta,
            self.budget.epsilon,
            _BOUND_STEPS,
            start=self._bound_start,
        )
        end = self._evaluated + m
        if step > end:
            self._bound_retry_at = step + _BOUND_RETRY
            self._bound_horizon = None
            return False
        self._bound_start = max(1, m)
        self._bound_horizon = (settings, end)
        return True

    def _check_budget(self, entry: _Queued) -> None:
        assert self.budget is not None
        step, sigma, q, _, settings = entry
        metric = self.budget.metric
        if self._rdp_allows(step, sigma, q):
            return
        if metric == "heuristic_epsilon" and self._bound_allows(step, sigma, settings):
            return
        self._evaluate(need=metric)  # exact: this step's own value decides
        record = self._ready[-1]
        value = getattr(record, metric)
        if value > self.budget.epsilon:
            self._ready.pop()
            self._take_back(record)
            self._refuse(step, value)

    def _take_back(self, record: EpsilonRecord) -> None:
        """Undo the evaluated last step everywhere (accountants, replica, RDP, history)."""
        for acc in (self.accountant, self._corrected if self._own_corrected else None):
            if acc is not None:
                acc.load_state_dict(_drop_last_step(acc.state_dict()))
        if self._replica is not None:
            self._replica.drop_last_step()
        self._rdp.rdp = self._rdp.previous
        last = self._history[-1]
        if last[2] > 1:
            last[2] -= 1
        else:
            self._history.pop()
        self._evaluated -= 1
        self._reset_horizons()

    def _refuse(self, step: int, value: float) -> None:
        assert self.budget is not None
        msg = (
            f"PrivacyMonitor: step {step} would bring {self.budget.metric} to {value:.6g} > "
            f"the budget {self.budget.epsilon:g} at delta={self.delta:g}; the step was not "
            f"taken (the model and accountant are as after step {step - 1})."
        )
        self.stop_reason = msg
        if self.budget.action == "raise":
            raise PrivacyBudgetExceededError(
                msg, step=step, metric=self.budget.metric, value=value, limit=self.budget.epsilon
            )
        self.should_stop = True
        self._skip_update = True

    # -- evaluation -----------------------------------------------------------------------

    def _evaluate(self, need: str | None = None) -> None:
        """Compute the records of the queued steps, in order (``need``: a field that the
        last one must have, for the budget). Runs of steps with the same settings under the
        constant-rate formula are replayed together (:meth:`_Replica.replay_constant`)."""
        queue, self._queue = self._queue, []
        if not queue:
            return
        rdp = self._rdp.advance([(sigma, q) for _, sigma, q, _, _ in queue], self.delta)
        last = len(queue) - 1
        i = 0
        while i < len(queue):
            j = self._constant_run(queue, i, need)
            heuristics = None
            if j - i >= _MIN_RUN:
                _, sigma, q, _, settings = queue[i]
                heuristics = self._replica.replay_constant(  # type: ignore[union-attr]
                    sigma, q, settings, j - i, self.delta
                )
            if heuristics is None:
                self._ready.append(
                    self._evaluate_step(queue[i], float(rdp[i]), need if i == last else None)
                )
                i += 1
                continue
            for k in range(i, j):
                _, sigma, q, _, _ = queue[k]
                _extend(self._history, sigma, q)
                self._evaluated += 1
                self._ready.append(
                    self._record(
                        queue[k], float(rdp[k]), float(heuristics[k - i]),
                        need if k == last else None,
                    )
                )  # fmt: skip
            i = j

    def _constant_run(self, queue: list[_Queued], i: int, need: str | None) -> int:
        """The end j of the run queue[i:j] that can be replayed together: the same (sigma,
        q, settings), the heuristic due at every step, and nothing else due (nor ``need``)
        before its last step."""
        replica = self._replica
        if replica is None or self.heuristic_every != 1 or replica.weighted:
            return i
        _, sigma, q, _, settings = queue[i]
        j = i
        while j < len(queue):
            step, s_j, q_j, _, settings_j = queue[j]
            if (s_j, q_j, settings_j) != (sigma, q, settings):
                break
            j += 1
            if (
                (need is not None and j == len(queue))
                or _due(step, self.robust_every)
                or _due(step, self.standard_every)
            ):
                break
        return j

    def _evaluate_step(self, entry: _Queued, rdp: float, need: str | None) -> EpsilonRecord:
        step, sigma, q, _, settings = entry
        d = self.delta
        _extend(self._history, sigma, q)
        self._evaluated += 1
        heuristic = None
        replica = self._replica
        if replica is not None:
            replica.replay(sigma, q, settings)
            every = self.weighted_every if replica.weighted else self.heuristic_every
            if need == "heuristic_epsilon" or _due(step, every):
                heuristic = float(replica.get_epsilon(d))
        return self._record(entry, rdp, heuristic, need)

    def _record(
        self, entry: _Queued, rdp: float, heuristic: float | None, need: str | None
    ) -> EpsilonRecord:
        """The record of the step just replayed: the robust and standard epsilons when due
        (or needed) at this step."""
        step, sigma, q, lr, _ = entry
        d = self.delta
        robust = None
        replica = self._replica
        if replica is not None and (
            need == "robust_epsilon" or self._cadenced(step, "robust", self.robust_every)
        ):
            robust = float(
                self._charged("robust", self.robust_every, lambda: replica.get_epsilon(d, robust=True))
            )
        pld = corrected = None
        if self._cadenced(step, "standard", self.standard_every):
            pld, corrected = self._charged("standard", self.standard_every, self._standard)
        self._last_lr = lr
        return EpsilonRecord(
            step=step,
            delta=d,
            heuristic_epsilon=heuristic,
            robust_epsilon=robust,
            standard_epsilon_rdp=rdp,
            standard_epsilon_pld=pld,
            corrected_epsilon=corrected,
            lr=lr,
            noise_multiplier=float(sigma),
            sample_rate=float(q),
            final=False,
        )

    def _cadenced(self, step: int, kind: str, every: Cadence) -> bool:
        """Whether the ``kind`` value ("robust" or "standard") is due at ``step``."""
        return _due(step, every) and (every != "auto" or self._overhead.allows(kind))

    def _charged(self, kind: str, every: Cadence, compute: Callable[[], Any]) -> Any:
        """``compute()``, its time charged to the overhead budget under ``"auto"``."""
        if every != "auto":
            return compute()
        t0 = _clock()
        out = compute()
        self._overhead.charge(kind, _clock() - t0)
        return out

    def _standard(self) -> tuple[float, float | None]:
        """PLD and corrected epsilon of the evaluated steps."""
        from opacus_lastiterate.analysis.baselines.composition import StandardComposition

        history = [tuple(h) for h in self._history]
        pld = float(StandardComposition(history).epsilon(self.delta))
        corrected = None
        if self._corrected is not None:
            acc = self._corrected
            if _num_steps(acc) != self._evaluated:  # it is ahead: a copy at this step
                acc = copy.deepcopy(acc)
                acc.history = history
                acc._externally_assigned = False
            corrected = float(acc.get_epsilon(self.delta))
        return pld, corrected

    def flush(self) -> None:
        """Compute the records of every recorded step and send them to the sinks (and the
        audit), in step order. With ``evaluation="process"``: send the recorded steps to the
        evaluation process and emit the records that have come back."""
        if self._uses_worker:
            self._send()
            self._collect(wait=False)
        else:
            self._evaluate()
        ready, self._ready = self._ready, []
        self._reissue_warnings()
        for record in ready:
            self._emit(record)

    def _emit(self, record: EpsilonRecord) -> None:
        self.last_record = record
        self.records_emitted += 1
        if self.calls_sinks:
            for sink in self.sinks:
                sink(record)
        if self.audit is not None:
            self.audit.on_step(record)

    # -- end of training ------------------------------------------------------------------

    def finish(self) -> EpsilonRecord | None:
        """Flush, emit a final record with every epsilon (heuristic, robust, PLD,
        corrected) of the final model, call the audit's ``finish`` (its result in
        :attr:`audit_result`) and close the sinks that have a ``close`` method (on every
        rank, also those that ``sink_rank`` kept silent). Returns the final record (None
        before any step). A second call without new steps (an adapter may have finished
        already) returns the same record and emits nothing."""
        self._drain()
        self.flush()
        if self._final is not None and self._final[0] == self._evaluated:
            return self._final[1]
        record = None
        if self._history:
            record = self._remote_final() if self._worker is not None else self._final_record()
            self._reissue_warnings()
            self._emit(record)
        self._stop_worker()
        if self.audit is not None:
            self.audit_result = self.audit.finish()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                close()
        self._final = (self._evaluated, record)
        return record

    def _final_record(self) -> EpsilonRecord:
        """The final record: every epsilon of the evaluated steps (some must exist)."""
        sigma, q, _ = self._history[-1]
        d = self.delta
        heuristic = robust = None
        if self._replica is not None:
            heuristic = float(self._replica.get_epsilon(d))
            robust = float(self._replica.get_epsilon(d, robust=True))
        pld, corrected = self._standard()
        return EpsilonRecord(
            step=self._evaluated,
            delta=d,
            heuristic_epsilon=heuristic,
            robust_epsilon=robust,
            standard_epsilon_rdp=self._rdp.epsilon(d),
            standard_epsilon_pld=pld,
            corrected_epsilon=corrected,
            lr=self._last_lr,
            noise_multiplier=float(sigma),
            sample_rate=float(q),
            final=True,
        )

    # -- evaluation in a separate process ---------------------------------------------------

    @property
    def _weighted_grid(self) -> float:
        """The replica's weighted-engine grid: coarser when the weighted heuristic is asked
        for every 50 steps or less often (``SPARSE_FINE_POINTS``: half the work per step;
        each logged value is still an upper bound within ``weight_accuracy``)."""
        every = self.weighted_every
        if every is None or every == "doubling" or every >= _SPARSE_CADENCE:
            return SPARSE_FINE_POINTS
        return FINE_POINTS

    @property
    def _uses_worker(self) -> bool:
        return self.evaluation == "process" and not self._worker_failed

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the evaluation process (``evaluation="process"``) has started; True
        then and with ``evaluation="inline"``, False on timeout or if it failed (the
        monitor then evaluates inline)."""
        if self._worker is None:
            return not self._uses_worker
        return bool(self._worker.wait_ready(timeout))

    def _start_worker(self, dropped: int = 0) -> None:
        """Start an evaluation process at the evaluated state (the accountant without its
        last ``dropped`` steps, which are queued)."""
        from opacus_lastiterate.callbacks._evaluation_process import EvaluationWorker

        config = {
            "accountant": self.accountant,
            "corrected": self._corrected if self._own_corrected else None,
            "dropped": dropped,
            "delta": self.delta,
            "heuristic_every": self.heuristic_every,
            "weighted_every": self.weighted_every,
            # off the training thread, "auto" has no overhead to keep within: "doubling"
            "robust_every": "doubling" if self.robust_every == "auto" else self.robust_every,
            "standard_every": (
                "doubling" if self.standard_every == "auto" else self.standard_every
            ),
            "rdp": self._rdp.rdp,
            "last_lr": self._last_lr,
        }
        try:
            self._worker = EvaluationWorker(pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:  # accounting must never stop training
            self._fall_back(f"it could not be started: {type(exc).__name__}: {exc}")

    def _stop_worker(self, kill: bool = False) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(kill)

    def _send(self) -> None:
        """Send the queued steps to the evaluation process; the history, the RDP vector and
        the learning rate move on at once (:meth:`state_dict` needs nothing more)."""
        if not self._queue:
            return
        if self._worker is None:  # stopped by finish(): training went on
            self._start_worker(dropped=len(self._queue))
            if self._worker is None:
                return
        queue, self._queue = self._queue, []
        self._in_flight.append((queue, self._rdp.rdp, self._last_lr))
        self._rdp.advance([(sigma, q) for _, sigma, q, _, _ in queue], self.delta)
        for _, sigma, q, _, _ in queue:
            _extend(self._history, sigma, q)
        self._evaluated += len(queue)
        self._last_lr = queue[-1][3]
        corrected = self._corrected
        settings = None if corrected is None else (
            dict(corrected._config), corrected._observed_dimension
        )
        self._worker.send(("batch", queue, settings))

    def _collect(self, wait: bool) -> None:
        """Move the answered batches' records to the ready list (``wait``: until every sent
        step is answered)."""
        while self._worker is not None and self._in_flight:
            answer = self._worker.receive(wait)
            if answer is None:
                return
            if answer[0] != "records":
                self._fall_back(answer[1])
                return
            _, records, caught = answer
            self._in_flight.pop(0)
            self._ready.extend(records)
            self._worker_warnings.extend(caught)

    def _drain(self) -> None:
        """Send the queued steps and wait for every record (evaluation="process")."""
        if self._uses_worker:
            self._send()
            self._collect(wait=True)

    def _remote_final(self) -> EpsilonRecord:
        """The final record, computed by the evaluation process (after :meth:`_drain`)."""
        self._worker.send(("final",))
        answer = self._worker.receive(True)
        if answer[0] == "final":
            self._worker_warnings.extend(answer[2])
            return answer[1]  # type: ignore[no-any-return]
        self._fall_back(answer[1])
        return self._final_record()

    def _reissue_warnings(self) -> None:
        """Warn here what the evaluation process warned (the user's filters apply)."""
        if self._worker_warnings:
            from opacus_lastiterate._warn import warn

            caught, self._worker_warnings = self._worker_warnings, []
            for message, category in caught:
                warn(message, category)

    def _fall_back(self, reason: str) -> None:
        """The evaluation process failed: evaluate inline from now on. The steps sent and
        not answered are evaluated again here, from the accountant's state without them."""
        from opacus_lastiterate._warn import warn

        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(kill=True)
        self._worker_failed = True
        warn(
            f"PrivacyMonitor: the evaluation process failed ({reason}); the records are "
            "computed on the training thread from now on (evaluation='inline').",
            MonitorWarning,
        )
        unanswered = [entry for batch, _, _ in self._in_flight for entry in batch]
        if self._in_flight:
            _, self._rdp.rdp, self._last_lr = self._in_flight[0]
            self._in_flight = []
        acc = self.accountant
        dropped = len(unanswered) + len(self._queue)
        state = _drop_last_steps(acc.state_dict(), dropped)
        self._replica = (
            _Replica.of(acc, state, self._weighted_grid) if self._heuristic else None
        )
        self._history = [list(h) for h in state["history"]]
        self._evaluated = _num_steps(acc) - dropped
        self._queue = unanswered + self._queue
        self._evaluate()

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable state of plain Python values (JSON-serialisable): the
        accountant's history (Lightning and Hugging Face checkpoints do not save Opacus's
        accountant), the corrected accountant's, the RDP vector, the budget flag and the
        last record. Flushes first, so that the sinks hold every record up to the
        checkpoint (with ``evaluation="process"``, after waiting for every record)."""
        self._drain()
        self.flush()

        def plain(state: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: ([list(e) for e in v] if isinstance(v, list) else v)
                for k, v in state.items()
            }

        return {
            "format": 2,
            "accountant": plain(self.accountant.state_dict()),
            "corrected_accountant": (
                plain(self._corrected.state_dict()) if self._own_corrected else None
            ),
            "rdp": [float(v) for v in self._rdp.rdp],
            "should_stop": self.should_stop,
            "stop_reason": self.stop_reason,
            "records_emitted": self.records_emitted,
            "last_record": None if self.last_record is None else self.last_record.as_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any], *, rewind_sinks: bool = True) -> None:
        """Restore :meth:`state_dict` (the accountants' histories included); records queued
        and not yet flushed are dropped.

        Args:
            state: a :meth:`state_dict` (format 1 or 2).
            rewind_sinks: call ``rewind(step)`` on the sinks that have it (the JSONL and CSV
                sinks drop their records after the restored step), so that a run resumed
                from a checkpoint neither repeats nor skips a step in them.

        Raises:
            TypeError, ValueError: if ``state`` is not such a state; nothing changes then
                unless an accountant rejects its part.
        """
        if not isinstance(state, Mapping) or state.get("format") not in (1, 2):
            raise ValueError("`state` must be a PrivacyMonitor.state_dict() (format 1 or 2).")
        last = state.get("last_record")
        if last is not None and (not isinstance(last, Mapping) or set(last) != set(FIELDS)):
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.")
        rdp = state.get("rdp")
        if rdp is not None and (
            not isinstance(rdp, (list, tuple))
            or not all(isinstance(v, numbers.Real) for v in rdp)
        ):
            raise ValueError("`state['rdp']` must be a list of numbers.")

        def tuples(s: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: ([tuple(e) for e in v] if k in ("history", "optimizer_trace") else v)
                for k, v in s.items()
            }

        self.accountant.load_state_dict(tuples(state["accountant"]))
        if self._own_corrected and state.get("corrected_accountant") is not None:
            self._corrected.load_state_dict(tuples(state["corrected_accountant"]))
        self.should_stop = bool(state.get("should_stop", False))
        self.stop_reason = state.get("stop_reason")
        self.records_emitted = int(state.get("records_emitted", 0))
        self.last_record = None if last is None else EpsilonRecord(**last)
        self._sync(rdp)
        self._overhead.restart()
        if rewind_sinks and self.calls_sinks:
            for sink in self.sinks:
                rewind = getattr(sink, "rewind", None)
                if callable(rewind):
                    rewind(self._evaluated)

    def __repr__(self) -> str:
        return (
            f"PrivacyMonitor(delta={self.delta:g}, steps={_num_steps(self.accountant)}, "
            f"sinks={len(self.sinks)}, budget={self.budget!r}, attached={self.attached})"
        )
