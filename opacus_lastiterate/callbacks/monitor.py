"""A framework-free privacy monitor for Opacus training: epsilon after every step.

:class:`PrivacyMonitor` attaches to an Opacus ``DPOptimizer`` (the one ``make_private``
returned) and, after every optimizer step, produces one :class:`EpsilonRecord`:

* ``heuristic_epsilon``: the last-iterate heuristic of the final model (every step; the
  accountant's incremental value; not a DP guarantee for deep networks);
* ``robust_epsilon``: its certified maximum over suffixes (every ``robust_every`` steps and
  at :meth:`PrivacyMonitor.finish`; 20-75 ms per evaluation at large T);
* ``standard_epsilon_rdp``: standard composition (all iterates released) from an RDP
  vector that is updated in O(1) per step, converted with the min over orders: a cheap
  *upper bound* on the standard epsilon (every step);
* ``standard_epsilon_pld``: the tight standard epsilon, dp_accounting's PLD accountant
  (:class:`~opacus_lastiterate.analysis.baselines.composition.StandardComposition`, about
  0.5 s) every ``standard_every`` steps and at the end;
* ``corrected_epsilon``: a normalisation accountant's epsilon (``"asgm"``/``"feasgm"``,
  ``docs/normalisation.md``) on the ``standard_every`` cadence, when one is monitored;
* ``lr``, ``noise_multiplier``, ``sample_rate`` of the step.

Fields not computed at a step are ``None``. Records go to *sinks*
(:mod:`opacus_lastiterate.callbacks.sinks`: logging, JSONL, CSV, TensorBoard, W&B, MLflow or
any callable). A :class:`PrivacyBudget` stops training *before* the step that would push a
chosen epsilon past a limit.

How it hooks in: Opacus calls ``optimizer.step_hook`` (the accountant's hook) inside
``DPOptimizer.pre_step``, after the noise is added and before the parameters change. The
monitor wraps that hook (the accountant records the step, then the monitor computes the
record and checks the budget) and the wrapped optimizer's ``step`` (the update; records are
emitted after it). A step refused by the budget is taken back from the accountant and the
update is not applied. Every value is a Python float computed on the host from the
accountant's bookkeeping: the monitor never reads a tensor (no ``.item()``, ``.cpu()``,
``.tolist()``), so it adds no device synchronisation to a GPU training step.

Distributed training (Opacus's ``DistributedDPOptimizer`` under ``torch.distributed``):
create the monitor on every rank. Every rank's accountant records every step (each rank's
optimizer calls its hook with the same noise multiplier and sample rate), so the histories,
the epsilons and the budget guard's decisions are the same on every rank: a refused step is
refused everywhere, before the gradients' all-reduce for ``action="raise"`` and at the update
for ``action="stop"``, and no rank is left waiting in a collective. Only the sinks are
rank-dependent: by default they are called on rank 0 only (``sink_rank``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.exceptions import PrivacyBudgetExceededError

__all__ = [
    "FIELDS",
    "LABELS",
    "BudgetMetric",
    "EpsilonRecord",
    "IncrementalRDP",
    "MonitorAudit",
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
        metric: ``"heuristic_epsilon"`` (default), ``"robust_epsilon"`` (then evaluated
            every step: 20-75 ms each at large T) or ``"standard_epsilon_rdp"`` (the RDP
            upper bound on the standard epsilon, so the tight PLD value is within budget
            too).
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


class IncrementalRDP:
    """Standard composition by RDP: one vector over orders, added to once per step.

    The per-step RDP of the Poisson-subsampled Gaussian (Opacus's ``compute_rdp``, the
    Mironov et al. bound) is cached per distinct (sigma, q); :meth:`epsilon` converts with
    Opacus's ``get_privacy_spent`` (min over orders). An upper bound on the standard
    epsilon, looser than the PLD value.
    """

    def __init__(self, orders: Sequence[float] | None = None) -> None:
        from opacus.accountants import RDPAccountant

        self.orders = np.asarray(
            RDPAccountant.DEFAULT_ALPHAS if orders is None else orders, dtype=float
        )
        self.rdp = np.zeros_like(self.orders)
        self._cache: dict[tuple[float, float], np.ndarray] = {}

    def _per_step(self, noise_multiplier: float, sample_rate: float) -> np.ndarray:
        key = (noise_multiplier, sample_rate)
        vec = self._cache.get(key)
        if vec is None:
            if noise_multiplier == 0.0:
                vec = np.full_like(self.orders, np.inf)
            else:
                from opacus.accountants.analysis.rdp import compute_rdp

                vec = np.asarray(
                    compute_rdp(
                        q=sample_rate,
                        noise_multiplier=noise_multiplier,
                        steps=1,
                        orders=list(self.orders),
                    ),
                    dtype=float,
                )
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

    def epsilon(self, delta: float) -> float:
        """min over orders of the RDP-to-(epsilon, delta) conversion (0 before any step)."""
        if not np.any(self.rdp):
            return 0.0
        if not np.all(np.isfinite(self.rdp)):
            return math.inf
        from opacus.accountants.analysis.rdp import get_privacy_spent

        eps, _ = get_privacy_spent(orders=list(self.orders), rdp=list(self.rdp), delta=delta)
        return float(eps)


# -- helpers --------------------------------------------------------------------------------


def _check_cadence(name: str, value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1 or None, got {value!r}.")
    return int(value)


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
        robust_every: compute ``robust_epsilon`` every k steps (and at :meth:`finish`);
            None: only at :meth:`finish`.
        standard_every: compute ``standard_epsilon_pld`` and ``corrected_epsilon`` every k
            steps (and at :meth:`finish`); None: only at :meth:`finish`.
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
    """

    def __init__(
        self,
        accountant: object,
        *,
        delta: float,
        sinks: Iterable[Sink] = (),
        robust_every: int | None = 100,
        standard_every: int | None = 100,
        corrected_accountant: object = None,
        budget: PrivacyBudget | None = None,
        audit: MonitorAudit | None = None,
        optimizer: object = None,
        sink_rank: int | None = 0,
    ) -> None:
        from opacus_lastiterate.accountants import LastIterateAccountant
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
        self.robust_every = _check_cadence("robust_every", robust_every)
        self.standard_every = _check_cadence("standard_every", standard_every)
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
        self.budget = budget
        self.audit = audit
        self.audit_result: Any = None
        self.records_emitted = 0
        self.last_record: EpsilonRecord | None = None
        self.should_stop = False
        """True once the budget refused a step (``action="stop"``)."""
        self.stop_reason: str | None = None
        self._rdp = IncrementalRDP()
        self._rdp.reset(self.accountant.history)
        self._pending: EpsilonRecord | None = None
        self._skip_update = False
        self._optimizer: Any = None
        self._inner_hook: Callable[[Any], None] | None = None
        if optimizer is not None:
            self.attach(optimizer)

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
        self._inner_hook = optimizer.step_hook
        optimizer.step_hook = self._on_pre_step  # type: ignore[assignment]
        inner = optimizer.original_optimizer
        inner_step = inner.step

        def step(*args: Any, **kwargs: Any) -> Any:
            return self._on_update(inner_step, *args, **kwargs)

        inner.step = step  # instance attribute: DPOptimizer.step calls original_optimizer.step()
        optimizer._privacy_monitor = self  # type: ignore[attr-defined]
        self._optimizer = optimizer
        return self

    def detach(self) -> None:
        """Undo :meth:`attach` (the accountant's hook is restored)."""
        opt = self._optimizer
        if opt is None:
            return
        opt.step_hook = self._inner_hook
        opt.original_optimizer.__dict__.pop("step", None)
        opt._privacy_monitor = None
        self._optimizer = None

    # -- per step -------------------------------------------------------------------------

    def _on_pre_step(self, optim: Any) -> None:
        """The wrapped step hook: account for the step, check the budget, build the record."""
        self._flush_pending()
        if self.should_stop:
            self._skip_update = True
            return
        assert self._inner_hook is not None
        self._inner_hook(optim)
        sigma, q = _last_step(self.accountant)
        if self._own_corrected:  # what its own hook would record: the same (sigma, q)
            self._corrected._observe(optim)
            self._corrected._record(sigma, q)
        self._rdp.add(sigma, q)
        record = self._record(optim, sigma, q, final=False)
        if self.budget is not None:
            value = getattr(record, self.budget.metric)
            if value is None:  # robust_epsilon off its cadence
                value = self.accountant.get_epsilon(self.delta, robust=True)
            if value > self.budget.epsilon:
                self._refuse(record.step, value)
                return
        self._pending = record

    def _refuse(self, step: int, value: float) -> None:
        assert self.budget is not None
        self._undo_last_step()
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

    def _undo_last_step(self) -> None:
        for acc in (self.accountant, self._corrected if self._own_corrected else None):
            if acc is not None:
                acc.load_state_dict(_drop_last_step(acc.state_dict()))
        self._rdp.reset(self.accountant.history)

    def _on_update(self, inner_step: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._skip_update:
            self._skip_update = False
            return None
        out = inner_step(*args, **kwargs)
        self._flush_pending()
        return out

    def _flush_pending(self) -> None:
        record, self._pending = self._pending, None
        if record is not None:
            self._emit(record)

    def _record(self, optim: Any, sigma: float, q: float, *, final: bool) -> EpsilonRecord:
        acc, d = self.accountant, self.delta
        step = _num_steps(acc)
        robust = pld = corrected = heuristic = None
        if self._heuristic:
            heuristic = float(acc.get_epsilon(d))
            if final or (self.robust_every and step % self.robust_every == 0):
                robust = float(acc.get_epsilon(d, robust=True))
        if final or (self.standard_every and step % self.standard_every == 0):
            from opacus_lastiterate.analysis.baselines.composition import StandardComposition

            pld = float(StandardComposition(acc.history).epsilon(d))
            if self._corrected is not None:
                corrected = float(self._corrected.get_epsilon(d))
        lr = None
        if optim is not None:
            lr = _host_float(optim.param_groups[0].get("lr"))
        elif self.last_record is not None:
            lr = self.last_record.lr
        return EpsilonRecord(
            step=step,
            delta=d,
            heuristic_epsilon=heuristic,
            robust_epsilon=robust,
            standard_epsilon_rdp=self._rdp.epsilon(d),
            standard_epsilon_pld=pld,
            corrected_epsilon=corrected,
            lr=lr,
            noise_multiplier=float(sigma),
            sample_rate=float(q),
            final=final,
        )

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
        """Emit a final record with every epsilon (robust, PLD, corrected), call the audit's
        ``finish`` (its result in :attr:`audit_result`) and close the sinks that have a
        ``close`` method (on every rank, also those that ``sink_rank`` kept silent).
        Returns the final record (None before any step)."""
        self._flush_pending()
        record = None
        history = self.accountant.history
        if history:
            sigma, q, _ = history[-1]
            record = self._record(self._optimizer, sigma, q, final=True)
            self._emit(record)
        if self.audit is not None:
            self.audit_result = self.audit.finish()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                close()
        return record

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A checkpointable state (plain Python values): the accountant's history (Lightning
        and Hugging Face checkpoints do not save Opacus's accountant), the corrected
        accountant's, the budget flag and the last record."""
        def plain(state: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: ([list(e) for e in v] if isinstance(v, list) else v)
                for k, v in state.items()
            }

        return {
            "format": 1,
            "accountant": plain(self.accountant.state_dict()),
            "corrected_accountant": (
                plain(self._corrected.state_dict()) if self._own_corrected else None
            ),
            "should_stop": self.should_stop,
            "stop_reason": self.stop_reason,
            "records_emitted": self.records_emitted,
            "last_record": None if self.last_record is None else self.last_record.as_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the accountants' histories included).

        Raises:
            TypeError, ValueError: if ``state`` is not such a state; nothing changes then
                unless an accountant rejects its part.
        """
        if not isinstance(state, Mapping) or state.get("format") != 1:
            raise ValueError("`state` must be a PrivacyMonitor.state_dict() (format 1).")
        last = state.get("last_record")
        if last is not None and (not isinstance(last, Mapping) or set(last) != set(FIELDS)):
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.")

        def tuples(s: Mapping[str, Any]) -> dict[str, Any]:
            return {
                k: ([tuple(e) for e in v] if k in ("history", "optimizer_trace") else v)
                for k, v in s.items()
            }

        self.accountant.load_state_dict(tuples(state["accountant"]))
        if self._own_corrected and state.get("corrected_accountant") is not None:
            self._corrected.load_state_dict(tuples(state["corrected_accountant"]))
        self._rdp.reset(self.accountant.history)
        self.should_stop = bool(state.get("should_stop", False))
        self.stop_reason = state.get("stop_reason")
        self.records_emitted = int(state.get("records_emitted", 0))
        self.last_record = None if last is None else EpsilonRecord(**last)
        self._pending = None

    def __repr__(self) -> str:
        return (
            f"PrivacyMonitor(delta={self.delta:g}, steps={_num_steps(self.accountant)}, "
            f"sinks={len(self.sinks)}, budget={self.budget!r}, attached={self.attached})"
        )
