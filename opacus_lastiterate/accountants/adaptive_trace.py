"""The adaptive-optimizer trace of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`:
the :class:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.AdaptiveStep` of every
recorded step (settings of Adam, AdamW, ... and the noise they saw), run-length encoded, and
the form its ``state_dict`` stores under ``"adaptive_trace"``.

In memory the trace is numpy columns (:class:`AdaptiveTrace`, the analysis'
:class:`~opacus_lastiterate.analysis.last_iterate.adaptive_columns.AdaptiveStepTrace`: each
field run-length encoded over the runs of identical steps), not a Python object per run,
and it goes to the kept model as columns when a state is loaded. The stored form
(:func:`encode_adaptive_trace`) run-length encodes each field of
:data:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.ADAPTIVE_STEP_FIELDS` on its
own with the SGD trace's column encoding
(:func:`~opacus_lastiterate.accountants.optimizer_trace.encode_column`):
``{"lr": {"values": b"...", "steps": b"..."}, "optimizer": {"values": ["adamw"],
"steps": b"..."}, ...}``, the real fields as little-endian float64 bytes, the flags one byte
each, the optimizer's name a list of strings, the run lengths little-endian int64 bytes. A
cosine schedule, whose learning rate changes at every step, costs 16 bytes a step; the
fields that stay put one run each. ``torch.load(weights_only=True)`` reads the bytes without
a Python object per element; for JSON (the monitor's checkpoint)
:func:`~opacus_lastiterate.accountants.optimizer_trace.trace_as_text` gives the bytes as
base64 text. The lists of Python values that earlier versions stored are read too. A stored
trace is validated whole, in numpy, by :func:`decode_adaptive_trace` before anything is
loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate.accountants.optimizer_trace import (
    check_column_mapping,
    check_trace_covers,
    decode_column,
    decode_trace,
    encode_column,
    merge_columns,
    real_column,
    trace_as_lists,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_columns import (
    AdaptiveColumns,
    AdaptiveStepTrace,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    ADAPTIVE_STEP_FIELDS,
    AdaptiveStep,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import canonical_adaptive_name
from opacus_lastiterate.analysis.last_iterate.settings_columns import TraceColumns

__all__ = ["adaptive_trace_as_lists"]

AdaptiveRuns = list[tuple[AdaptiveStep, int]]

_FLAGS = ("decoupled_weight_decay", "amsgrad", "centered")
_KINDS: dict[str, str] = {
    f: "text" if f == "optimizer" else "flag" if f in _FLAGS else "real"
    for f in ADAPTIVE_STEP_FIELDS
}
"""The kind of each stored column (:func:`~.optimizer_trace.decode_column`)."""

_BELOW_ONE = ("beta1", "beta2")
"""The real fields in [0, 1) (RMSprop's beta1, its momentum, is any number >= 0); noise_std
lies in (0, inf), the others in [0, inf)."""

_ONE_RUN = ("optimizer", *_FLAGS)
"""The fields that stay the same through a run (one optimizer with the same options)."""


class AdaptiveTrace(AdaptiveStepTrace):
    """The accountant's run-length encoded :class:`AdaptiveStep` records: the analysis'
    growable columns (:class:`~opacus_lastiterate.analysis.last_iterate.adaptive_columns.
    AdaptiveStepTrace`) with the trimming and the stored form of a checkpoint.

    Args:
        runs: (step, number of steps) pairs to start from, oldest first, validated
            :class:`AdaptiveColumns` (taken over), or None.
    """

    def trimmed(self, steps: int) -> AdaptiveTrace:
        """A copy without the last ``steps`` steps."""
        columns = self.columns()
        keep = max(self.covered - steps, 0)
        ends = np.cumsum(columns.steps)
        m = int(np.searchsorted(ends, keep, side="left")) + 1 if keep else 0  # runs kept
        counts = columns.steps[:m].copy()
        if m:
            counts[-1] -= int(ends[m - 1]) - keep
        return AdaptiveTrace(AdaptiveColumns._make((*(c[:m].copy() for c in columns.fields), counts)))

    def encoded(self) -> dict[str, dict[str, Any]]:
        """The stored form of the trace (:func:`encode_adaptive_trace`)."""
        columns = self.columns()
        if not len(columns.steps):  # empty lists: torch's protocol 2 pickles b"" as a call
            return {field: {"values": [], "steps": []} for field in ADAPTIVE_STEP_FIELDS}
        ends = np.cumsum(columns.steps)
        return {
            field: encode_column(column, ends)
            for field, column in zip(ADAPTIVE_STEP_FIELDS, columns.fields, strict=True)
        }


def encode_adaptive_trace(trace: AdaptiveTrace | AdaptiveRuns) -> dict[str, dict[str, Any]]:
    """The stored form of a trace (or of its runs): each field run-length encoded over the
    steps on its own (module docstring); :func:`decode_adaptive_trace` gives back the same
    floats, bit for bit."""
    if not isinstance(trace, AdaptiveTrace):
        trace = AdaptiveTrace(trace)
    return trace.encoded()


def adaptive_trace_as_lists(stored: Mapping[str, Any]) -> dict[str, dict[str, list[Any]]]:
    """A stored adaptive trace (bytes, base64 text or lists) as plain lists of Python
    strings, floats, bools and ints, to read or edit (:func:`decode_adaptive_trace` reads
    this form too).

    Raises:
        TypeError, ValueError: a column that is not bytes, base64 text or a list, or bytes
            that are not whole elements (named).
    """
    return trace_as_lists(stored, _KINDS)


def decode_adaptive_trace(stored: object, name: str) -> AdaptiveTrace:
    """Validate a stored adaptive trace (:func:`encode_adaptive_trace`, or its lists) whole,
    column by column in numpy, and return it, one run per run of identical steps.

    Raises:
        TypeError, ValueError: naming the first bad part (``name['lr']['values'][3]``, an
            optimizer without adaptive weights, the options of one that it does not have),
            fields that cover different numbers of steps, or an optimizer or option that
            changes during the run.
    """
    stored = check_column_mapping(stored, name, ADAPTIVE_STEP_FIELDS)
    columns: list[tuple[np.ndarray, np.ndarray]] = []
    rmsprop = False
    for field in ADAPTIVE_STEP_FIELDS:  # the optimizer first: RMSprop's beta1 is unbounded
        where = f"{name}[{field!r}]"
        values, counts = decode_column(stored[field], _KINDS[field], where)
        if field == "optimizer":
            names = []
            for i, v in enumerate(values):
                try:
                    names.append(canonical_adaptive_name(v))
                except ValueError as err:
                    raise ValueError(f"`{where}['values'][{i}]`: {err}") from None
            rmsprop = "rmsprop" in names
            values = np.array(names, dtype=object)
        elif _KINDS[field] == "real":
            below_one = field in _BELOW_ONE and not (field == "beta1" and rmsprop)
            values = real_column(
                values, f"{where}['values']", 0.0, 1.0 if below_one else math.inf,
                low_open=field == "noise_std",
            )  # fmt: skip
        columns.append((values, counts))
    picked, steps = merge_columns(columns, ADAPTIVE_STEP_FIELDS, name)
    if not len(steps):
        return AdaptiveTrace()
    for field in _ONE_RUN:
        column = picked[ADAPTIVE_STEP_FIELDS.index(field)]
        changed = np.flatnonzero(column != column[0])
        if changed.size:
            raise ValueError(
                f"`{name}[{field!r}]` changes at run {int(changed[0])}: one run uses one "
                "optimizer with the same options throughout."
            )
    try:  # the options the optimizer has (they stay the same: checked once)
        first = AdaptiveStep.from_tuple([c[:1].tolist()[0] for c in picked])
    except (TypeError, ValueError) as err:
        raise type(err)(f"`{name}` at run 0 (steps up to {int(steps[0])}): {err}") from None
    for field in ("optimizer", "decoupled_weight_decay"):  # as the settings store them
        picked[ADAPTIVE_STEP_FIELDS.index(field)][:] = getattr(first.settings, field)
    # runs the columns split but that are the same steps (as AdaptiveStep compares) merge
    same = np.ones(len(steps) - 1, dtype=bool)
    for column in picked:
        same &= column[1:] == column[:-1]
    if same.any():
        starts = np.flatnonzero(np.append(True, ~same))
        picked = [column[starts] for column in picked]
        steps = np.add.reduceat(steps, starts)
    return AdaptiveTrace(AdaptiveColumns._make((*picked, steps.astype(np.int64))))


def decode_traces(
    state_dict: Mapping[str, Any],
) -> tuple[TraceColumns | None, bool, AdaptiveTrace]:
    """The optimizer traces of an accountant's ``state_dict``, validated whole against its
    history: the SGD trace (None when absent), whether the trace is off, and the adaptive
    trace (empty when absent).

    Raises:
        TypeError, ValueError: a malformed trace (named by its key), a trace that does not
            cover the history, or both traces holding steps.
    """
    stored = state_dict.get("optimizer_trace")
    trace = None if stored is None else decode_trace(stored, "state_dict['optimizer_trace']")
    disabled = state_dict.get("optimizer_trace_disabled", False)
    if not isinstance(disabled, bool):
        raise TypeError(
            f"`state_dict['optimizer_trace_disabled']` must be a bool, got {disabled!r}."
        )
    check_trace_covers(
        [] if trace is None else trace.steps, state_dict["history"], disabled,
        "state_dict['optimizer_trace']",
    )  # fmt: skip
    stored = state_dict.get("adaptive_trace")
    adaptive = (
        AdaptiveTrace()
        if stored is None
        else decode_adaptive_trace(stored, "state_dict['adaptive_trace']")
    )
    if len(adaptive) and trace is not None and len(trace.steps):
        raise ValueError(
            "`state_dict['adaptive_trace']` and `state_dict['optimizer_trace']` must not "
            "both hold steps: one run uses one optimizer."
        )
    check_trace_covers(
        adaptive.steps, state_dict["history"], disabled, "state_dict['adaptive_trace']"
    )
    return trace, disabled, adaptive
