"""The optimizer trace of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`:
the SGD settings it recorded, run-length encoded, and the compact form its ``state_dict``
stores; the validation of a stored trace and its trimming by steps taken back.

In memory the trace is a list of entries ``(lr, momentum, dampening, nesterov,
weight_decay, steps)``, one per run of identical settings. The stored form
(:func:`encode_trace`) run-length encodes each setting on its own,
``{"lr": {"values": [...], "steps": [...]}, "momentum": {...}, ...}``: a schedule that
changes the learning rate at every step costs one float and one small int per step (about
11 bytes pickled, 10^6 steps about 11 MB), and the settings that stay put one run each. It
holds plain lists of Python floats, ints and bools, so that ``torch.load(weights_only=True)``
and JSON take it, and it is validated column by column in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_steps

__all__ = [
    "TraceEntry",
]

# One run of identical optimizer settings: (lr, momentum, dampening, nesterov, weight_decay, steps)
TraceEntry = tuple[float, float, float, bool, float, int]

TRACE_FIELDS = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
"""The settings of a trace entry, in its order; the keys of the stored trace."""

_REAL_RANGES = {"lr": (math.inf, True), "momentum": (1.0, False),
                "dampening": (1.0, False), "weight_decay": (math.inf, True)}  # fmt: skip
"""(upper end, whether it is open) of each real setting; each lies in [0, upper end)."""


class TraceColumns(NamedTuple):
    """A trace as one numpy array per field, one element per entry."""

    lr: np.ndarray
    momentum: np.ndarray
    dampening: np.ndarray
    nesterov: np.ndarray
    weight_decay: np.ndarray
    steps: np.ndarray

    def entries(self) -> list[TraceEntry]:
        """The entries as tuples of Python floats, bools and ints (the same floats)."""
        return list(zip(*(column.tolist() for column in self), strict=True))

    def settings_at(self, i: int) -> tuple[float, float, float, bool, float]:
        """(lr, momentum, dampening, nesterov, weight_decay) of entry ``i``."""
        return (float(self.lr[i]), float(self.momentum[i]), float(self.dampening[i]),
                bool(self.nesterov[i]), float(self.weight_decay[i]))  # fmt: skip

    def varies(self) -> bool:
        """Whether the settings change the weights of the steps (see
        :meth:`LastIterateAccountant.uses_weights`)."""
        lr = self.lr
        return bool((lr[1:] != lr[:-1]).any() or self.momentum.any() or self.weight_decay.any())


class SettingsTrace:
    """The run-length encoded trace of an accountant, in growable numpy columns (no Python
    object per entry; an entry added in amortised O(1)): the number of steps it covers and
    whether its settings change the weights are kept as it grows."""

    def __init__(self, columns: TraceColumns | None = None) -> None:
        n = 0 if columns is None else len(columns.steps)
        size = max(16, n)
        self._reals = np.empty((size, 4))  # lr, momentum, dampening, weight_decay
        self._nesterov = np.empty(size, dtype=bool)
        self._runs = np.empty(size, dtype=np.int64)
        self._n = n
        self._last: tuple[float, float, float, bool, float] | None = None
        self._covered = 0
        self._varies = False
        self._first_lr = 0.0
        if columns is not None and n:
            self._reals[:n] = np.column_stack(
                (columns.lr, columns.momentum, columns.dampening, columns.weight_decay)
            )
            self._nesterov[:n] = columns.nesterov
            self._runs[:n] = columns.steps
            self._last = (*self._reals[n - 1, :3].tolist(), bool(self._nesterov[n - 1]),
                          float(self._reals[n - 1, 3]))  # fmt: skip
            self._covered = int(columns.steps.sum())
            self._varies = columns.varies()
            self._first_lr = float(columns.lr[0])

    def __len__(self) -> int:
        return self._n

    @property
    def last(self) -> tuple[float, float, float, bool, float] | None:
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

    def append(self, key: tuple[float, float, float, bool, float], steps: int) -> bool:
        """Add ``steps`` steps with settings ``key``; True if they start a new entry."""
        self._covered += steps
        if self._last == key:
            self._runs[self._n - 1] += steps
            return False
        n = self._n
        if n == len(self._runs):
            self._reals = np.concatenate((self._reals, np.empty_like(self._reals)))
            self._nesterov = np.concatenate((self._nesterov, np.empty_like(self._nesterov)))
            self._runs = np.concatenate((self._runs, np.empty_like(self._runs)))
        lr, momentum, dampening, nesterov, weight_decay = key
        self._reals[n] = (lr, momentum, dampening, weight_decay)
        self._nesterov[n] = nesterov
        self._runs[n] = steps
        if n == 0:
            self._first_lr = lr
        self._varies = (
            self._varies or lr != self._first_lr or momentum != 0.0 or weight_decay != 0.0
        )
        self._n, self._last = n + 1, key
        return True

    def columns(self) -> TraceColumns:
        """The entries as columns (views: read them, do not write them)."""
        n, reals = self._n, self._reals
        return TraceColumns(reals[:n, 0], reals[:n, 1], reals[:n, 2], self._nesterov[:n],
                            reals[:n, 3], self._runs[:n])  # fmt: skip

    def entries(self) -> list[TraceEntry]:
        """The entries as tuples (lr, momentum, dampening, nesterov, weight_decay, steps)."""
        return self.columns().entries()


def encode_trace(trace: list[TraceEntry] | TraceColumns) -> dict[str, dict[str, list[Any]]]:
    """The stored form of a trace (entries or columns): each setting run-length encoded over
    the steps on its own (``values[i]`` holds for ``steps[i]`` steps); the same floats, bit
    for bit."""
    if not isinstance(trace, TraceColumns):
        trace = _columns_of(trace)
    n = len(trace.steps)
    ends = np.cumsum(trace.steps)
    out: dict[str, dict[str, list[Any]]] = {}
    for k, field in enumerate(TRACE_FIELDS):
        column = trace[k]
        key = column if field == "nesterov" else column.view(np.int64)  # 0.0 and -0.0 apart
        last = np.append(np.flatnonzero(key[1:] != key[:-1]), n - 1) if n else ends
        out[field] = {
            "values": column[last].tolist(),  # the last entry of each run
            "steps": np.diff(ends[last], prepend=0).tolist(),
        }
    return out


def _columns_of(trace: list[TraceEntry]) -> TraceColumns:
    n = len(trace)
    return TraceColumns._make(
        np.fromiter((e[k] for e in trace), dtype, n)
        for k, dtype in enumerate((float, float, float, bool, float, np.int64))
    )


def check_column_mapping(
    stored: object, name: str, fields: Sequence[str]
) -> Mapping[str, Any]:
    """``stored``, checked to be a mapping with exactly the keys ``fields`` (a stored trace's
    columns, each ``{'values': [...], 'steps': [...]}``).

    Raises:
        TypeError: not a mapping. ValueError: other keys (both naming ``name``).
    """
    if not isinstance(stored, Mapping):
        raise TypeError(
            f"`{name}` must be a mapping of {', '.join(fields)} to "
            f"{{'values': [...], 'steps': [...]}}, got {type(stored).__name__}."
        )
    if set(stored) != set(fields):
        raise ValueError(
            f"`{name}` must have exactly the keys {list(fields)}, "
            f"got {sorted(map(str, stored))}."
        )
    return stored


def decode_trace(stored: object, name: str) -> TraceColumns:
    """Validate a stored trace (:func:`encode_trace`) column by column and return its
    entries, one per run of identical settings, as columns.

    Raises:
        TypeError, ValueError: naming the first bad field (``name['momentum']['values'][3]``),
            or columns that cover different numbers of steps.
    """
    stored = check_column_mapping(stored, name, TRACE_FIELDS)
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for field in TRACE_FIELDS:
        columns[field] = _column(stored[field], field, f"{name}[{field!r}]")
    totals = {field: int(steps.sum()) for field, (_, steps) in columns.items()}
    if len(set(totals.values())) > 1:
        raise ValueError(f"`{name}`: every setting must cover the same steps, got {totals}.")
    cums = [np.cumsum(steps) for _, steps in columns.values()]
    ends = np.sort(np.concatenate(cums))  # the ends of the entries: every column's run ends
    ends = ends[np.append(True, ends[1:] != ends[:-1])] if ends.size else ends
    picked = tuple(
        values[np.searchsorted(cum, ends - 1, side="right")]
        for (values, _), cum in zip(columns.values(), cums, strict=True)
    )
    return TraceColumns._make([*picked, np.diff(ends, prepend=0)])


def _column(part: object, field: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, steps) of one stored setting, validated."""
    if not isinstance(part, Mapping) or set(part) != {"values", "steps"}:
        raise TypeError(
            f"`{name}` must be a mapping with exactly the keys 'values' and 'steps', got "
            f"{sorted(map(str, part)) if isinstance(part, Mapping) else type(part).__name__}."
        )
    values, steps = part["values"], part["steps"]
    for key, seq in (("values", values), ("steps", steps)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"`{name}[{key!r}]` must be a list, got {type(seq).__name__}.")
    if len(values) != len(steps):
        raise ValueError(
            f"`{name}`: 'values' and 'steps' must have the same length, got "
            f"{len(values)} and {len(steps)}."
        )
    counts = _steps_column(steps, f"{name}['steps']")
    if field == "nesterov":
        for i, v in enumerate(values):
            if type(v) is not bool:
                raise TypeError(f"`{name}['values'][{i}]` must be a bool, got {v!r}.")
        return np.array(values, dtype=bool), counts
    high, high_open = _REAL_RANGES[field]
    return _real_column(values, f"{name}['values']", high, high_open), counts


def _real_column(values: list[Any] | tuple[Any, ...], name: str, high: float,
                 high_open: bool) -> np.ndarray:  # fmt: skip
    """The values as floats, each checked to lie in [0, high) (closed at ``high`` unless
    ``high_open``); in numpy for Python floats and ints (a bool is neither here), one by one
    otherwise and to name the first bad one."""
    if set(map(type, values)) <= {float, int}:
        try:
            arr = np.array(values, dtype=float)
        except OverflowError:
            arr = None
        if arr is not None:
            ok = (arr >= 0.0) & ((arr < high) if high_open else (arr <= high))  # NaN fails
            if ok.all():
                return arr
    out = [
        check_in_interval(f"{name}[{i}]", v, 0.0, high, low_open=False, high_open=high_open)
        for i, v in enumerate(values)
    ]
    return np.array(out, dtype=float)


def _steps_column(steps: list[Any] | tuple[Any, ...], name: str) -> np.ndarray:
    """The run lengths as int64, each an integer >= 1."""
    if set(map(type, steps)) <= {int}:
        try:
            arr = np.array(steps, dtype=np.int64)
        except OverflowError:
            arr = None
        if arr is not None and (arr >= 1).all():
            return arr
    return np.array([check_steps(s, f"{name}[{i}]", minimum=1) for i, s in enumerate(steps)],
                    dtype=np.int64)  # fmt: skip


def check_trace_covers(runs: Any, history: Any, disabled: bool, name: str) -> None:
    """A validated trace (``runs``: the steps of its entries) must cover every step of the
    (validated) history, or be empty:
    a trace of other steps would silently change the model of the run (the weighted
    heuristic becomes the constant-rate one, or weighs steps that were not taken); a trace
    whose settings are disabled (``optimizer_trace_disabled``) must be empty."""
    if not len(runs):
        return
    if disabled:
        raise ValueError(
            f"`{name}` must be empty when the trace is disabled, got {len(runs)} entries."
        )
    covered = int(np.sum(runs))
    steps = sum(int(h[2]) for h in history)
    if covered != steps:
        raise ValueError(
            f"`{name}` must cover every recorded step: it covers {covered} step(s), the "
            f"history {steps}; a trace of other steps would change the model of the run."
        )


def trim_trace(trace: list[tuple[Any, ...]], steps: int) -> list[tuple[Any, ...]]:
    """``trace`` without its last ``steps`` steps (entries shortened or dropped)."""
    trace = list(trace)
    while steps and trace:
        *key, n = trace[-1]
        cut = min(steps, n)
        trace[-1:] = [(*key, n - cut)] if n > cut else []
        steps -= cut
    return trace
