"""The optimizer trace of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`:
the SGD settings it recorded, run-length encoded, as its ``state_dict`` stores them; the
validation of a stored trace and its trimming by steps taken back.

A long trace (a schedule changes the rate at every step: one entry per step) of plain Python
floats and ints is checked column by column in numpy against the same ranges as the
entry-by-entry check, which only runs to name the first bad field.
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_steps

__all__ = ["TraceEntry", "check_trace_covers", "trim_trace", "validate_trace"]

# One run of identical optimizer settings: (lr, momentum, dampening, nesterov, weight_decay, steps)
TraceEntry = tuple[float, float, float, bool, float, int]


_TRACE_REALS = ((0, "lr", math.inf, True), (1, "momentum", 1.0, False),
                (2, "dampening", 1.0, False), (4, "weight_decay", math.inf, True))  # fmt: skip
"""The real fields of a trace entry: (index, name, upper end, whether it is open); each lies
in [0, upper end)."""


def validate_trace(trace: object, name: str) -> list[TraceEntry]:
    """Validate a recorded optimizer trace (see :attr:`LastIterateAccountant.optimizer_trace`)."""
    if not isinstance(trace, (list, tuple)):
        raise TypeError(f"`{name}` must be a list of 6-tuples, got {type(trace).__name__}.")
    fast = _plain_trace(trace)
    if fast is not None:
        return fast
    out: list[TraceEntry] = []
    for i, entry in enumerate(trace):
        if not isinstance(entry, (list, tuple)) or len(entry) != 6:
            raise TypeError(
                f"`{name}[{i}]` must be (lr, momentum, dampening, nesterov, weight_decay, "
                f"steps), got {entry!r}."
            )
        if not isinstance(entry[3], bool):
            raise TypeError(f"`{name}[{i}].nesterov` must be a bool, got {entry[3]!r}.")
        lr, momentum, dampening, weight_decay = (
            check_in_interval(f"{name}[{i}].{field}", entry[k], 0.0, high, low_open=False,
                              high_open=high_open)
            for k, field, high, high_open in _TRACE_REALS
        )  # fmt: skip
        steps = check_steps(entry[5], f"{name}[{i}].steps", minimum=1)
        out.append((lr, momentum, dampening, entry[3], weight_decay, steps))
    return out


def _plain_trace(trace: list[Any] | tuple[Any, ...]) -> list[TraceEntry] | None:
    """:func:`_validate_trace` of a trace of Python floats and ints (the state_dict of this
    accountant), checked column by column in numpy against the same ranges: the same
    entries, in one pass instead of a few microseconds per entry (a checkpoint of 10^5 steps
    under a schedule holds 10^5 entries); None for anything else, which the entry-by-entry
    check then reports."""
    if not trace:
        return []
    # exact types (a bool is neither a float nor an int here), checked by map in C
    if not (set(map(type, trace)) <= {tuple, list} and set(map(len, trace)) == {6}):
        return None
    columns = [list(map(itemgetter(k), trace)) for k in range(6)]
    reals = [columns[k] for k, *_ in _TRACE_REALS]
    if not (
        set(map(type, columns[3])) == {bool}
        and set(map(type, columns[5])) == {int}
        and all(set(map(type, col)) <= {float, int} for col in reals)
    ):
        return None
    try:
        a = np.array(reals, dtype=float)
        n = np.array(columns[5], dtype=np.int64)
    except OverflowError:
        return None
    for row, (_, _, high, high_open) in zip(a, _TRACE_REALS, strict=True):
        # NaN fails every comparison
        if not ((row >= 0.0) & ((row < high) if high_open else (row <= high))).all():
            return None
    if not (n >= 1).all():
        return None
    lr, momentum, dampening, weight_decay = (row.tolist() for row in a)
    return list(zip(lr, momentum, dampening, columns[3], weight_decay, n.tolist(), strict=True))


def check_trace_covers(trace: list[TraceEntry], history: Any, disabled: bool, name: str) -> None:
    """A validated trace must cover every step of the (validated) history, or be empty:
    a trace of other steps would silently change the model of the run (the weighted
    heuristic becomes the constant-rate one, or weighs steps that were not taken); a trace
    whose settings are disabled (``optimizer_trace_disabled``) must be empty."""
    if not trace:
        return
    if disabled:
        raise ValueError(
            f"`{name}` must be empty when the trace is disabled, got {len(trace)} entries."
        )
    covered = sum(e[5] for e in trace)
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
