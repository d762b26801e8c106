"""SGD settings of a run kept as numpy columns, run-length encoded: no Python object per step.

A run of T steps under a schedule that changes the learning rate at every step has T entries;
kept as Python objects (a settings instance and a list per entry) they cost over 100 bytes a
step, kept here 41 (four float64 settings, a bool and an int64 run length). Both the
accountant's optimizer trace and :class:`~opacus_lastiterate.analysis.kept_model.KeptModel`
keep their SGD settings in a :class:`SettingsTrace`; :class:`TraceColumns` is its read-only
view, which the accountant's stored form is decoded into and the kept model is built from in
one step (``KeptModel.from_run``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "SettingsTrace",
]

SettingsKey = tuple[float, float, float, bool, float]
"""(lr, momentum, dampening, nesterov, weight_decay) of one step."""

TraceEntry = tuple[float, float, float, bool, float, int]
"""One run of identical settings: (lr, momentum, dampening, nesterov, weight_decay, steps)."""


class TraceColumns(NamedTuple):
    """Run-length encoded SGD settings as one numpy array per field, one element per entry."""

    lr: np.ndarray
    momentum: np.ndarray
    dampening: np.ndarray
    nesterov: np.ndarray
    weight_decay: np.ndarray
    steps: np.ndarray

    def entries(self) -> list[TraceEntry]:
        """The entries as tuples of Python floats, bools and ints (the same floats)."""
        return list(zip(*(column.tolist() for column in self), strict=True))

    def settings_at(self, i: int) -> SettingsKey:
        """(lr, momentum, dampening, nesterov, weight_decay) of entry ``i``."""
        return (float(self.lr[i]), float(self.momentum[i]), float(self.dampening[i]),
                bool(self.nesterov[i]), float(self.weight_decay[i]))  # fmt: skip

    def varies(self) -> bool:
        """Whether the settings change the weights of the steps (a learning rate that
        changes, momentum or weight decay)."""
        lr = self.lr
        return bool((lr[1:] != lr[:-1]).any() or self.momentum.any() or self.weight_decay.any())

    def per_step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(lr, momentum, dampening, nesterov, weight_decay), one element per step."""
        counts = self.steps
        return tuple(np.repeat(column, counts) for column in self[:5])  # type: ignore[return-value]

    def without_empty(self) -> TraceColumns:
        """The columns without their entries of 0 steps."""
        keep = self.steps > 0
        return self if keep.all() else TraceColumns._make(column[keep] for column in self)


_KINDS = (float, float, float, bool, float, np.int64)
"""The types of the columns of :class:`TraceColumns`, in its order."""


class SettingsTrace:
    """Run-length encoded SGD settings in growable numpy columns (an entry added in amortised
    O(1)); the number of steps covered and whether the settings change the weights are kept
    as it grows.

    Args:
        columns: the entries to start from (copied), or None for none.
    """

    def __init__(self, columns: TraceColumns | None = None) -> None:
        n = 0 if columns is None else len(columns.steps)
        if columns is None or not n:
            columns = TraceColumns(*(np.empty(16, dtype=k) for k in _KINDS))
        # one contiguous array per field (a copy: appends may write into the last entry)
        self._cols = [np.array(column, dtype=k) for column, k in zip(columns, _KINDS, strict=True)]
        self._n = n
        self._last: SettingsKey | None = None
        self._covered = 0
        self._varies = False
        self._first_lr = 0.0
        if n:
            self._last = self.columns().settings_at(n - 1)
            self._covered = int(columns.steps.sum())
            self._varies = columns.varies()
            self._first_lr = float(columns.lr[0])

    def __len__(self) -> int:
        return self._n

    @property
    def last(self) -> SettingsKey | None:
        """(lr, momentum, dampening, nesterov, weight_decay) of the last entry."""
        return self._last

    @property
    def covered(self) -> int:
        """The number of steps the trace covers."""
        return self._covered

    @property
    def varies(self) -> bool:
        """Whether the settings change the weights of the steps (a learning rate that
        changes, momentum or weight decay)."""
        return self._varies

    def append(self, key: SettingsKey, steps: int) -> bool:
        """Add ``steps`` steps with settings ``key``; True if they start a new entry."""
        self._covered += steps
        if self._last == key:
            self._cols[5][self._n - 1] += steps
            return False
        n, cols = self._n, self._cols
        if n == len(cols[0]):
            self._cols = cols = [np.concatenate((c, np.empty_like(c))) for c in cols]
        for c, value in zip(cols[:5], key, strict=True):
            c[n] = value
        cols[5][n] = steps
        lr, momentum, _, _, weight_decay = key
        if n == 0:
            self._first_lr = lr
        self._varies = (
            self._varies or lr != self._first_lr or momentum != 0.0 or weight_decay != 0.0
        )
        self._n, self._last = n + 1, key
        return True

    def columns(self) -> TraceColumns:
        """The entries as columns (views: read them, do not write them)."""
        n = self._n
        return TraceColumns._make(c[:n] for c in self._cols)

    def entries(self) -> list[TraceEntry]:
        """The entries as tuples (lr, momentum, dampening, nesterov, weight_decay, steps)."""
        return self.columns().entries()


class HeavyBallTrace:
    """The learning rates of heavy-ball SGD at one momentum (no dampening, Nesterov or weight
    decay), one per step in a growable float64 column (8 bytes a step, a step added in
    amortised O(1)): the SGD equivalent of an Adam or AdamW run
    (:class:`~.adaptive_steps.SGDEquivalent`), as the kept model follows it.

    Args:
        momentum: the momentum of every step.
        rates: the learning rates to start from (copied), or None for none.
    """

    def __init__(self, momentum: float, rates: np.ndarray | None = None) -> None:
        self.momentum = float(momentum)
        """The momentum of every step."""
        self._rates = np.array(rates if rates is not None and len(rates) else np.empty(16), float)
        self._n = 0 if rates is None else len(rates)

    def __len__(self) -> int:
        return self._n

    def append(self, lr: float) -> None:
        """Add a step at learning rate ``lr``."""
        n = self._n
        if n == len(self._rates):
            self._rates = np.concatenate((self._rates, np.empty(max(16, n))))
        self._rates[n] = lr
        self._n = n + 1

    def key(self, lr: float) -> SettingsKey:
        """(lr, momentum, dampening, nesterov, weight_decay) of a step at rate ``lr``."""
        return (lr, self.momentum, 0.0, False, 0.0)

    def columns(self) -> TraceColumns:
        """The steps as :class:`TraceColumns`, one entry per step (new arrays)."""
        n = self._n
        zeros = np.zeros(n)
        return TraceColumns(
            self._rates[:n].copy(), zeros + self.momentum, zeros, zeros.astype(bool), zeros,
            np.ones(n, dtype=np.int64),
        )  # fmt: skip
