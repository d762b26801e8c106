"""The optimizer trace of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`:
the SGD settings it recorded, run-length encoded, and the compact form its ``state_dict``
stores; the validation of a stored trace and its trimming by steps taken back.

In memory the trace is a
:class:`~opacus_lastiterate.analysis.last_iterate.settings_columns.SettingsTrace` (numpy
columns, one entry per run of identical settings). The stored form (:func:`encode_trace`)
run-length encodes each setting on its own, ``{"lr": {"values": b"...", "steps": b"..."},
"momentum": {...}, ...}``, each column as the raw bytes of a little-endian array (the real
settings float64, ``nesterov`` one byte 0 or 1, the run lengths int64): a schedule that
changes the learning rate at every step costs 16 bytes a step (10^6 steps 16 MB), the
settings that stay put one run each. Bytes are what ``torch.load(weights_only=True)`` reads
without a Python object per element; :func:`trace_as_text` gives the same columns as base64
text for JSON (the monitor's checkpoint). :func:`decode_trace` reads the three forms (bytes,
base64 text, and plain lists of Python floats, ints and bools, as earlier versions stored)
and validates them column by column in numpy.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_steps
from opacus_lastiterate.analysis.last_iterate.settings_columns import TraceColumns, TraceEntry

__all__ = [
    "trace_as_lists",
    "trace_as_text",
]

TRACE_FIELDS = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
"""The settings of a trace entry, in its order; the keys of the stored trace."""

_REAL_RANGES = {"lr": (math.inf, True), "momentum": (1.0, False),
                "dampening": (1.0, False), "weight_decay": (math.inf, True)}  # fmt: skip
"""(upper end, whether it is open) of each real setting; each lies in [0, upper end)."""

_REAL, _FLAG, _COUNT = np.dtype("<f8"), np.dtype("u1"), np.dtype("<i8")
"""The stored types: the real settings as little-endian float64, nesterov as one byte (0 or
1), the run lengths as little-endian int64."""


def encode_trace(trace: list[TraceEntry] | TraceColumns) -> dict[str, dict[str, Any]]:
    """The stored form of a trace (entries or columns): each setting run-length encoded over
    the steps on its own (``values[i]`` holds for ``steps[i]`` steps), each column the raw
    bytes of a little-endian array (module docstring; an empty trace as empty lists); the
    same floats, bit for bit."""
    if not isinstance(trace, TraceColumns):
        trace = _columns_of(trace)
    n = len(trace.steps)
    ends = np.cumsum(trace.steps)
    out: dict[str, dict[str, Any]] = {}
    if not n:  # empty lists: torch's protocol 2 pickles b"" as a call weights_only refuses
        return {field: {"values": [], "steps": []} for field in TRACE_FIELDS}
    for k, field in enumerate(TRACE_FIELDS):
        column = trace[k]
        key = column if field == "nesterov" else column.view(np.int64)  # 0.0 and -0.0 apart
        last = np.append(np.flatnonzero(key[1:] != key[:-1]), n - 1) if n else ends
        kind = _FLAG if field == "nesterov" else _REAL
        out[field] = {
            "values": column[last].astype(kind).tobytes(),  # the last entry of each run
            "steps": np.diff(ends[last], prepend=0).astype(_COUNT).tobytes(),
        }
    return out


def trace_as_text(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored trace with each column of bytes as base64 text (for JSON), the other parts
    as they are; :func:`decode_trace` reads it back to the same floats. A part that is not
    a mapping of columns is returned unchanged (the decoder names it)."""
    if not isinstance(stored, Mapping):
        return stored  # type: ignore[return-value]
    return {
        field: (
            {
                key: (base64.b64encode(seq).decode("ascii") if isinstance(seq, bytes) else seq)
                for key, seq in part.items()
            }
            if isinstance(part, Mapping)
            else part
        )
        for field, part in stored.items()
    }


def trace_as_lists(stored: Mapping[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """A stored trace (bytes, base64 text or lists) as plain lists of Python floats, bools
    and ints, to read or edit (:func:`decode_trace` reads this form too; it takes one Python
    object per element, the bytes do not).

    Raises:
        TypeError, ValueError: a column that is not bytes, base64 text or a list, or bytes
            that are not whole elements (named).
    """
    out: dict[str, dict[str, list[Any]]] = {}
    for field, part in check_column_mapping(stored, "stored", TRACE_FIELDS).items():
        if not isinstance(part, Mapping) or set(part) != {"values", "steps"}:
            raise TypeError(f"`stored[{field!r}]` must be a mapping with the keys 'values' and 'steps'.")
        kind = _FLAG if field == "nesterov" else _REAL
        out[field] = {}
        for key, k in (("values", kind), ("steps", _COUNT)):
            raw = _raw(part[key], k, f"stored[{field!r}][{key!r}]")
            if isinstance(raw, np.ndarray):
                raw = (raw.astype(bool) if k is _FLAG else raw).tolist()
            out[field][key] = list(raw)
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
    kind = _FLAG if field == "nesterov" else _REAL
    values = _raw(part["values"], kind, f"{name}['values']")
    steps = _raw(part["steps"], _COUNT, f"{name}['steps']")
    if len(values) != len(steps):
        raise ValueError(
            f"`{name}`: 'values' and 'steps' must have the same length, got "
            f"{len(values)} and {len(steps)}."
        )
    counts = _steps_column(steps, f"{name}['steps']")
    if field == "nesterov":
        if isinstance(values, np.ndarray):
            bad = np.flatnonzero(values > 1)
            if bad.size:
                raise ValueError(
                    f"`{name}['values'][{bad[0]}]` must be 0 or 1 (a bool), got {values[bad[0]]}."
                )
            return values.astype(bool), counts
        for i, v in enumerate(values):
            if type(v) is not bool:
                raise TypeError(f"`{name}['values'][{i}]` must be a bool, got {v!r}.")
        return np.array(values, dtype=bool), counts
    high, high_open = _REAL_RANGES[field]
    return _real_column(values, f"{name}['values']", high, high_open), counts


def _raw(seq: object, kind: np.dtype, name: str) -> np.ndarray | list[Any] | tuple[Any, ...]:
    """A stored column as an array of ``kind`` (bytes, or base64 text of them), or the list
    it is (the plain form, checked element by element by the caller)."""
    if isinstance(seq, (list, tuple)):
        return seq
    if isinstance(seq, str):
        try:
            seq = base64.b64decode(seq.encode("ascii"), validate=True)
        except (UnicodeEncodeError, binascii.Error) as err:
            raise ValueError(f"`{name}` must be base64 text of the column's bytes: {err}.") from None
    if not isinstance(seq, (bytes, bytearray)):
        raise TypeError(f"`{name}` must be bytes, base64 text or a list, got {type(seq).__name__}.")
    if len(seq) % kind.itemsize:
        raise ValueError(
            f"`{name}` must hold whole {kind.itemsize}-byte elements, got {len(seq)} bytes."
        )
    return np.frombuffer(seq, dtype=kind)


def _real_column(values: np.ndarray | list[Any] | tuple[Any, ...], name: str, high: float,
                 high_open: bool) -> np.ndarray:  # fmt: skip
    """The values as floats, each checked to lie in [0, high) (closed at ``high`` unless
    ``high_open``); in numpy for an array and for Python floats and ints (a bool is neither
    here), one by one otherwise and to name the first bad one."""
    if isinstance(values, np.ndarray):
        as_floats = values.astype(float)
        fine = (as_floats >= 0.0) & ((as_floats < high) if high_open else (as_floats <= high))
        if fine.all():  # NaN fails
            return as_floats
        values = as_floats.tolist()  # named one by one below
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


def _steps_column(steps: np.ndarray | list[Any] | tuple[Any, ...], name: str) -> np.ndarray:
    """The run lengths as int64, each an integer >= 1."""
    if isinstance(steps, np.ndarray):
        bad = np.flatnonzero(steps < 1)
        if bad.size:
            raise ValueError(f"`{name}[{bad[0]}]` must be an integer >= 1, got {steps[bad[0]]}.")
        return steps.astype(np.int64)
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
