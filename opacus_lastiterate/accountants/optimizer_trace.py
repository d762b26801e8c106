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
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_steps

__all__ = [
    "TRACE_FIELDS",
    "TraceColumns",
    "TraceEntry",
    "check_trace_covers",
    "decode_trace",
    "encode_trace",
    "trim_trace",
]

# One run of identical optimizer settings: (lr, momentum, dampening, nesterov, weight_decay, steps)
TraceEntry = tuple[float, float, float, bool, float, int]

TRACE_FIELDS = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
"""The settings of a trace entry, in its order; the keys of the stored trace."""

_REAL_RANGES = {"lr": (math.inf, True), "momentum": (1.0, False),
                "dampening": (1.0, False), "weight_decay": (math.inf, True)}  # fmt: skip
"""(upper end, whether it is open) of each real setting; each lies in [0, upper end)."""


def encode_trace(trace: list[TraceEntry]) -> dict[str, dict[str, list[Any]]]:
    """The stored form of a trace: each setting run-length encoded over the steps on its
    own (``values[i]`` holds for ``steps[i]`` steps); the same floats, bit for bit."""
    n = len(trace)
    counts = np.fromiter((e[5] for e in trace), np.int64, n)
    ends = np.cumsum(counts)
    out: dict[str, dict[str, list[Any]]] = {}
    for k, field in enumerate(TRACE_FIELDS):
        if field == "nesterov":
            column = np.fromiter((e[k] for e in trace), bool, n)
            key = column
        else:
            column = np.fromiter((e[k] for e in trace), float, n)
            key = column.view(np.int64)  # bit patterns: 0.0 and -0.0 stay apart
        last = np.flatnonzero(key[1:] != key[:-1]) if n else np.zeros(0, np.int64)
        last = np.append(last, n - 1) if n else last  # the last entry of each run
        run_ends = ends[last]
        out[field] = {
            "values": column[last].tolist(),
            "steps": np.diff(run_ends, prepend=0).tolist(),
        }
    return out


def decode_trace(stored: object, name: str) -> TraceColumns:
    """Validate a stored trace (:func:`encode_trace`) column by column and return its
    entries, one per run of identical settings, as columns.

    Raises:
        TypeError, ValueError: naming the first bad field (``name['momentum']['values'][3]``),
            or columns that cover different numbers of steps.
    """
    if not isinstance(stored, Mapping):
        raise TypeError(
            f"`{name}` must be a mapping of {', '.join(TRACE_FIELDS)} to "
            f"{{'values': [...], 'steps': [...]}}, got {type(stored).__name__}."
        )
    if set(stored) != set(TRACE_FIELDS):
        raise ValueError(
            f"`{name}` must have exactly the keys {list(TRACE_FIELDS)}, "
            f"got {sorted(map(str, stored))}."
        )
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

    def varies(self) -> bool:
        """Whether the settings change the weights of the steps (see
        :meth:`LastIterateAccountant.uses_weights`)."""
        lr = self.lr
        return bool((lr[1:] != lr[:-1]).any() or self.momentum.any() or self.weight_decay.any())


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
