"""The adaptive-optimizer trace of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`:
the :class:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.AdaptiveStep` of every
recorded step (settings of Adam, AdamW, ... and the noise they saw), run-length encoded, and
the form its ``state_dict`` stores under ``"adaptive_trace"``.

The stored form run-length encodes each field of
:data:`~opacus_lastiterate.analysis.last_iterate.adaptive_steps.ADAPTIVE_STEP_FIELDS` on its
own, ``{"lr": {"values": [...], "steps": [...]}, "optimizer": {...}, ...}``, with plain Python
strings, floats, ints and bools (``torch.load(weights_only=True)`` and JSON take it). A
stored trace is validated whole (:func:`decode_adaptive_trace`) before anything is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from opacus_lastiterate.accountants.optimizer_trace import (
    check_column_mapping,
    check_trace_covers,
    decode_trace,
)
from opacus_lastiterate.analysis._validation import check_steps
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    ADAPTIVE_STEP_FIELDS,
    AdaptiveStep,
)
from opacus_lastiterate.analysis.last_iterate.settings_columns import TraceColumns

__all__ = []

AdaptiveRuns = list[tuple[AdaptiveStep, int]]


class AdaptiveTrace:
    """Run-length encoded :class:`AdaptiveStep` records, with the steps they cover."""

    def __init__(self, runs: AdaptiveRuns | None = None) -> None:
        self._runs: list[list[Any]] = [[s, int(n)] for s, n in (runs or [])]
        self._covered = sum(n for _, n in self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def covered(self) -> int:
        """The number of steps the trace covers."""
        return self._covered

    @property
    def last(self) -> AdaptiveStep | None:
        """The step of the last entry."""
        return self._runs[-1][0] if self._runs else None

    def append(self, step: AdaptiveStep, steps: int = 1) -> None:
        """Add ``steps`` steps recorded as ``step``."""
        self._covered += steps
        if self._runs and self._runs[-1][0] == step:
            self._runs[-1][1] += steps
        else:
            self._runs.append([step, steps])

    def runs(self) -> AdaptiveRuns:
        """(step, number of steps) pairs, oldest first."""
        return [(s, n) for s, n in self._runs]

    def trimmed(self, steps: int) -> AdaptiveTrace:
        """A copy without the last ``steps`` steps."""
        runs = self.runs()
        while steps and runs:
            step, n = runs[-1]
            cut = min(steps, n)
            runs[-1:] = [(step, n - cut)] if n > cut else []
            steps -= cut
        return AdaptiveTrace(runs)


def encode_adaptive_trace(runs: AdaptiveRuns) -> dict[str, dict[str, list[Any]]]:
    """The stored form of ``runs``: each field run-length encoded over the steps on its own."""
    rows = [step.as_tuple() for step, _ in runs]
    counts = [int(n) for _, n in runs]
    out: dict[str, dict[str, list[Any]]] = {}
    for k, field in enumerate(ADAPTIVE_STEP_FIELDS):
        values: list[Any] = []
        steps: list[int] = []
        for row, n in zip(rows, counts, strict=True):
            value = row[k]
            if values and type(values[-1]) is type(value) and values[-1] == value:
                steps[-1] += n
            else:
                values.append(value)
                steps.append(n)
        out[field] = {"values": values, "steps": steps}
    return out


def decode_adaptive_trace(stored: object, name: str) -> AdaptiveRuns:
    """Validate a stored adaptive trace (:func:`encode_adaptive_trace`) whole and return its
    runs (one per run of identical steps).

    Raises:
        TypeError, ValueError: naming the first bad part (``name['lr']['values'][3]``, or
            ``name`` at run i for a step whose values do not make valid settings), or fields
            that cover different numbers of steps.
    """
    stored = check_column_mapping(stored, name, ADAPTIVE_STEP_FIELDS)
    columns: list[tuple[list[Any], np.ndarray]] = []
    for field in ADAPTIVE_STEP_FIELDS:
        part, where = stored[field], f"{name}[{field!r}]"
        if not isinstance(part, Mapping) or set(part) != {"values", "steps"}:
            raise TypeError(f"`{where}` must be a mapping with exactly the keys 'values' and 'steps'.")
        values, steps = part["values"], part["steps"]
        for key, seq in (("values", values), ("steps", steps)):
            if not isinstance(seq, (list, tuple)):
                raise TypeError(f"`{where}[{key!r}]` must be a list, got {type(seq).__name__}.")
        if len(values) != len(steps):
            raise ValueError(
                f"`{where}`: 'values' and 'steps' must have the same length, got "
                f"{len(values)} and {len(steps)}."
            )
        counts = np.array(
            [check_steps(s, f"{where}['steps'][{i}]", minimum=1) for i, s in enumerate(steps)],
            dtype=np.int64,
        )
        columns.append((list(values), counts))
    totals = {f: int(c.sum()) for f, (_, c) in zip(ADAPTIVE_STEP_FIELDS, columns, strict=True)}
    if len(set(totals.values())) > 1:
        raise ValueError(f"`{name}`: every field must cover the same steps, got {totals}.")
    cums = [np.cumsum(c) for _, c in columns]
    ends = np.unique(np.concatenate(cums)) if cums else np.zeros(0, dtype=np.int64)
    picks = [np.searchsorted(cum, ends - 1, side="right") for cum in cums]
    runs: AdaptiveRuns = []
    lengths = np.diff(ends, prepend=0)
    for i, n in enumerate(lengths.tolist()):
        row = [values[int(p[i])] for (values, _), p in zip(columns, picks, strict=True)]
        try:
            step = AdaptiveStep.from_tuple(row)
        except (TypeError, ValueError) as err:
            raise type(err)(f"`{name}` at run {i} (steps up to {int(ends[i])}): {err}") from None
        first = runs[0][0].settings if runs else step.settings
        for flag in ("optimizer", "decoupled_weight_decay", "amsgrad", "centered"):
            if getattr(step.settings, flag) != getattr(first, flag):
                raise ValueError(
                    f"`{name}[{flag!r}]` changes at run {i}: one run uses one optimizer with "
                    "the same options throughout."
                )
        if runs and runs[-1][0] == step:
            runs[-1] = (step, runs[-1][1] + n)
        else:
            runs.append((step, n))
    return runs


def decode_traces(
    state_dict: Mapping[str, Any],
) -> tuple[TraceColumns | None, bool, AdaptiveRuns]:
    """The optimizer traces of an accountant's ``state_dict``, validated whole against its
    history: the SGD trace (None when absent), whether the trace is off, and the adaptive
    trace's runs (empty when absent).

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
        [] if stored is None else decode_adaptive_trace(stored, "state_dict['adaptive_trace']")
    )
    if adaptive and trace is not None and len(trace.steps):
        raise ValueError(
            "`state_dict['adaptive_trace']` and `state_dict['optimizer_trace']` must not "
            "both hold steps: one run uses one optimizer."
        )
    check_trace_covers(
        [n for _, n in adaptive], state_dict["history"], disabled,
        "state_dict['adaptive_trace']",
    )  # fmt: skip
    return trace, disabled, adaptive
