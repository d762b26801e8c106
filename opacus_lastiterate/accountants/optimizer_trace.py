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

The column encoding is shared with the adaptive optimizers' trace
(:mod:`~opacus_lastiterate.accountants.adaptive_trace`): :func:`encode_column` stores one
column, :func:`decode_column` reads and checks one back, :func:`real_column` checks a real
column against its range and :func:`merge_columns` turns the columns' runs into entries.
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

_KIND_TYPES: dict[str, np.dtype | None] = {"real": _REAL, "flag": _FLAG, "text": None}
"""The stored type of each kind of column (:func:`decode_column`); text is a list."""

_SGD_KINDS = {field: "flag" if field == "nesterov" else "real" for field in TRACE_FIELDS}
"""The kind of each column of the SGD trace."""


def encode_trace(trace: list[TraceEntry] | TraceColumns) -> dict[str, dict[str, Any]]:
    """The stored form of a trace (entries or columns): each setting run-length encoded over
    the steps on its own (``values[i]`` holds for ``steps[i]`` steps), each column the raw
    bytes of a little-endian array (module docstring; an empty trace as empty lists); the
    same floats, bit for bit."""
    if not isinstance(trace, TraceColumns):
        trace = _columns_of(trace)
    if not len(trace.steps):  # empty lists: torch's protocol 2 pickles b"" as a call weights_only refuses
        return {field: {"values": [], "steps": []} for field in TRACE_FIELDS}
    ends = np.cumsum(trace.steps)
    return {field: encode_column(trace[k], ends) for k, field in enumerate(TRACE_FIELDS)}


def encode_column(column: np.ndarray, ends: np.ndarray) -> dict[str, Any]:
    """One setting of a run-length trace, run-length encoded on its own: ``column`` holds the
    setting of each entry, ``ends`` the step at which each entry ends (the cumulative sum of
    the entries' steps; at least one entry). ``values`` are the raw bytes of the setting's
    runs (a float column as little-endian float64, compared bit for bit, so that 0.0 and
    -0.0 stay apart; a bool column one byte 0 or 1) or, for a column of strings, a list of
    them; ``steps`` the raw bytes of the runs' lengths (little-endian int64)."""
    n = len(column)
    kind: np.dtype | None
    if column.dtype == np.float64:
        key, kind = column.view(np.int64), _REAL
    elif column.dtype == np.bool_:
        key, kind = column, _FLAG
    else:
        key, kind = column, None
    last = np.append(np.flatnonzero(key[1:] != key[:-1]), n - 1)  # each run's last entry
    values = column[last]
    return {
        "values": values.tolist() if kind is None else values.astype(kind).tobytes(),
        "steps": np.diff(ends[last], prepend=0).astype(_COUNT).tobytes(),
    }


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


def trace_as_lists(
    stored: Mapping[str, Any], kinds: Mapping[str, str] | None = None
) -> dict[str, dict[str, list[Any]]]:
    """A stored trace (bytes, base64 text or lists) as plain lists of Python floats, bools
    and ints, to read or edit (:func:`decode_trace` reads this form too; it takes one Python
    object per element, the bytes do not). ``kinds`` maps each column to ``"real"``,
    ``"flag"`` or ``"text"`` (:func:`decode_column`); None: the SGD trace's.

    Raises:
        TypeError, ValueError: a column that is not bytes, base64 text or a list, or bytes
            that are not whole elements (named).
    """
    kinds = _SGD_KINDS if kinds is None else kinds
    out: dict[str, dict[str, list[Any]]] = {}
    for field, part in check_column_mapping(stored, "stored", tuple(kinds)).items():
        if not isinstance(part, Mapping) or set(part) != {"values", "steps"}:
            raise TypeError(f"`stored[{field!r}]` must be a mapping with the keys 'values' and 'steps'.")
        kind = _KIND_TYPES[kinds[field]]
        out[field] = {}
        for key, k in (("values", kind), ("steps", _COUNT)):
            where = f"stored[{field!r}][{key!r}]"
            if k is None and not isinstance(part[key], (list, tuple)):  # text: a list
                raise TypeError(f"`{where}` must be a list of strings, got {type(part[key]).__name__}.")
            raw = part[key] if k is None else _raw(part[key], k, where)
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
    columns: list[tuple[np.ndarray, np.ndarray]] = []
    for field in TRACE_FIELDS:
        where = f"{name}[{field!r}]"
        values, counts = decode_column(stored[field], _SGD_KINDS[field], where)
        if field != "nesterov":
            high, high_open = _REAL_RANGES[field]
            values = real_column(values, f"{where}['values']", 0.0, high, high_open=high_open)
        columns.append((values, counts))
    picked, steps = merge_columns(columns, TRACE_FIELDS, name)
    return TraceColumns._make([*picked, steps])


def merge_columns(
    columns: Sequence[tuple[np.ndarray, np.ndarray]], fields: Sequence[str], name: str
) -> tuple[list[np.ndarray], np.ndarray]:
    """The entries of validated run-length columns ((values, steps) each, named by
    ``fields``): an entry ends wherever any column's run ends. Returns each column's value
    at every entry and the entries' steps.

    Raises:
        ValueError: columns that cover different numbers of steps (naming ``name``).
    """
    totals = {f: int(steps.sum()) for f, (_, steps) in zip(fields, columns, strict=True)}
    if len(set(totals.values())) > 1:
        raise ValueError(f"`{name}`: every setting must cover the same steps, got {totals}.")
    cums = [np.cumsum(steps) for _, steps in columns]
    ends = np.sort(np.concatenate(cums))  # the ends of the entries: every column's run ends
    ends = ends[np.append(True, ends[1:] != ends[:-1])] if ends.size else ends
    picked = [
        values[np.searchsorted(cum, ends - 1, side="right")]
        for (values, _), cum in zip(columns, cums, strict=True)
    ]
    return picked, np.diff(ends, prepend=0)


def decode_column(part: object, kind: str, name: str) -> tuple[Any, np.ndarray]:
    """(values, steps) of one stored column ``{'values': ..., 'steps': ...}``
    (:func:`encode_column`, base64 text of its bytes, or lists), the run lengths validated
    (int64, each >= 1) and as many as the values. ``kind`` ``"flag"``: the values validated
    as a bool array; ``"text"``: as a list of strings (stored as a list); ``"real"``: the
    values as stored, a float64 array or a list, for :func:`real_column` to check against
    the setting's range.

    Raises:
        TypeError, ValueError: naming the bad part (``name['steps'][3]``).
    """
    if not isinstance(part, Mapping) or set(part) != {"values", "steps"}:
        raise TypeError(
            f"`{name}` must be a mapping with exactly the keys 'values' and 'steps', got "
            f"{sorted(map(str, part)) if isinstance(part, Mapping) else type(part).__name__}."
        )
    if kind == "text":
        values = part["values"]
        if not isinstance(values, (list, tuple)):
            raise TypeError(f"`{name}['values']` must be a list of strings, got {type(values).__name__}.")
    else:
        stored_type = _KIND_TYPES[kind]
        assert stored_type is not None
        values = _raw(part["values"], stored_type, f"{name}['values']")
    steps = _raw(part["steps"], _COUNT, f"{name}['steps']")
    if len(values) != len(steps):
        raise ValueError(
            f"`{name}`: 'values' and 'steps' must have the same length, got "
            f"{len(values)} and {len(steps)}."
        )
    counts = _steps_column(steps, f"{name}['steps']")
    if kind == "text":
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise TypeError(f"`{name}['values'][{i}]` must be a string, got {v!r}.")
        return list(values), counts
    if kind == "flag":
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
    return values, counts


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


def real_column(values: np.ndarray | list[Any] | tuple[Any, ...], name: str, low: float,
                high: float, *, low_open: bool = False, high_open: bool = True) -> np.ndarray:  # fmt: skip
    """The values of a real column (:func:`decode_column`) as a float64 array, each checked
    to lie between ``low`` and ``high`` (closed at ``low`` unless ``low_open``, open at
    ``high`` unless not ``high_open``); in numpy for an array and for Python floats and ints
    (a bool is neither here), one by one otherwise and to name the first bad one
    (``name[i]``).

    Raises:
        TypeError, ValueError: the first value that is not a real number in the interval.
    """

    def fine(arr: np.ndarray) -> bool:  # NaN fails
        above = arr > low if low_open else arr >= low
        below = arr < high if high_open else arr <= high
        return bool((above & below).all())

    if isinstance(values, np.ndarray):
        as_floats = values.astype(float)
        if fine(as_floats):
            return as_floats
        values = as_floats.tolist()  # named one by one below
    if set(map(type, values)) <= {float, int}:
        try:
            arr = np.array(values, dtype=float)
        except OverflowError:
            arr = None
        if arr is not None and fine(arr):
            return arr
    out = [
        check_in_interval(f"{name}[{i}]", v, low, high, low_open=low_open, high_open=high_open)
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
