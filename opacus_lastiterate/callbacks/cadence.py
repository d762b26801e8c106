"""When the monitor computes each value: cadences and the overhead budget of ``"auto"``.

A :data:`Cadence` is every k steps, ``"doubling"`` (steps 100, 200, 400, 800, ...: the total
cost of a value that grows with T stays within about twice its cost at the end), ``"auto"``
(for the robust and standard values: those doubling steps that fit in the monitor's overhead
budget, :class:`OverheadBudget`; for the weighted heuristic: every step whose value fits in
that budget, and every doubling step) or None (only at the end of training).
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

__all__ = []

Cadence = int | Literal["doubling", "auto"] | None
"""How often a value is computed: every k steps, ``"doubling"`` (at steps 100, 200, 400, 800,
...: the total cost of a value that grows with T stays within about twice its cost at the
end), ``"auto"`` (``robust_every`` and ``standard_every`` only: at those doubling steps that
fit in the monitor's ``max_overhead``; ``weighted_every``: every step whose value fits in
``max_overhead``, and the doubling steps whatever it costs), or None (only at
``PrivacyMonitor.finish``)."""

DOUBLING_START = 100
"""First step of the ``"doubling"`` cadence."""

clock: Callable[[], float] = time.perf_counter
"""The overhead budget's clock (a module attribute: tests replace it)."""


def check_cadence(name: str, value: object, *, doubling: bool = True, auto: bool = False) -> Any:
    """A validated cadence (``doubling``/``auto``: whether those strings are allowed)."""
    if value is None or (doubling and value == "doubling") or (auto and value == "auto"):
        return value
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        allowed = (', "doubling"' if doubling else "") + (', "auto"' if auto else "")
        raise ValueError(f"`{name}` must be an integer >= 1{allowed} or None, got {value!r}.")
    return int(value)


def check_max_overhead(value: object) -> float:
    """The ``"auto"`` cadences' budget: any real number (numpy's too, not a bool) in (0, 1]."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not (
        0.0 < float(value) <= 1.0
    ):
        raise ValueError(f"`max_overhead` must be a number in (0, 1], got {value!r}.")
    return float(value)


def due(step: int, every: Cadence) -> bool:
    """Whether a value with cadence ``every`` is computed at ``step``: every k steps, or at
    steps DOUBLING_START * 2^j (``"doubling"``; ``"auto"``: those of them that the overhead
    budget also allows), or never (None: only at the end)."""
    if every is None:
        return False
    if every == "doubling" or every == "auto":
        blocks, rest = divmod(step, DOUBLING_START)
        return rest == 0 and blocks > 0 and blocks & (blocks - 1) == 0
    return step % every == 0


@dataclass(frozen=True)
class Cadences:
    """The monitor's cadences, validated once (``PrivacyMonitor`` documents each)."""

    heuristic_every: Cadence = 1
    weighted_every: Cadence = "auto"
    robust_every: Cadence = "auto"
    standard_every: Cadence = "auto"

    def __post_init__(self) -> None:
        for name, auto in (
            ("heuristic_every", False),
            ("weighted_every", True),
            ("robust_every", True),
            ("standard_every", True),
        ):
            object.__setattr__(self, name, check_cadence(name, getattr(self, name), auto=auto))


class OverheadBudget:
    """The wall-clock budget of the ``"auto"`` cadence: a value due at a doubling step (for
    the weighted heuristic, ``"weighted"``: at any step) is computed when the seconds spent on such values so far, plus the value's last cost, stay
    within ``fraction`` of the training time since the monitor was attached (wall time less
    those seconds). Before a value was first timed its cost is taken as ``PRIOR``; its cost
    can grow with T, so the budget is kept to within that growth, not exactly."""

    # seconds, until measured (measured: a robust search 2-40 ms, a PLD epsilon 0.05-0.5 s,
    # a weighted heuristic asked alone 0.5-20 ms, per step of a batch solved together
    # 0.1-0.2 ms)
    PRIOR: ClassVar[Mapping[str, float]] = {
        "robust": 0.01, "standard": 0.1, "weighted": 0.0002, "weighted_step": 0.002,
    }  # fmt: skip
    EVERY_STEP: ClassVar[frozenset[str]] = frozenset({"weighted", "weighted_step"})
    """Kinds that ``"auto"`` computes at every step that fits (the others: at the doubling
    steps that fit); the doubling steps carry them whatever they cost."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.cost = dict(self.PRIOR)
        self.restart()

    def restart(self) -> None:
        """Count the training time from now (at attach and at a restored state)."""
        self.start = clock()
        self.spent = 0.0

    def allows(self, kind: str) -> bool:
        """Whether a ``kind`` value ("robust", "standard", "weighted": per step of a batch,
        "weighted_step": asked alone) fits in the budget now."""
        return self.fits(kind, 1)

    @property
    def training(self) -> float:
        """Seconds of training since :meth:`restart` (wall time less the time charged)."""
        return clock() - self.start - self.spent

    def fits(self, kind: str, count: int) -> bool:
        """Whether ``count`` more ``kind`` values, each at its last cost, fit in the budget
        now."""
        return self.spent + count * self.cost[kind] <= self.fraction * self.training

    def charge(self, kind: str, seconds: float) -> None:
        """Count ``seconds`` spent on a ``kind`` value (its cost from now on)."""
        self.cost[kind] = seconds
        self.spent += seconds

    def timed_batch(self, kind: str, count: int, compute: Callable[[], Any]) -> Any:
        """``compute()`` of ``count`` ``kind`` values together, its time charged to the
        budget (the cost of one from now on: their mean)."""
        t0 = clock()
        out = compute()
        seconds = clock() - t0
        self.cost[kind] = seconds / max(count, 1)
        self.spent += seconds
        return out

    def is_due(self, step: int, kind: str, every: Cadence) -> bool:
        """Whether the ``kind`` value on cadence ``every`` is computed at ``step``."""
        if every == "auto" and kind in self.EVERY_STEP:
            return due(step, "doubling") or self.allows(kind)
        return due(step, every) and (every != "auto" or self.allows(kind))

    def timed(self, kind: str, every: Cadence, compute: Callable[[], Any]) -> Any:
        """``compute()``, its time charged to the budget under ``"auto"``."""
        if every != "auto":
            return compute()
        t0 = clock()
        out = compute()
        self.charge(kind, clock() - t0)
        return out
