"""Recorded steps of an adaptive optimiser kept as numpy columns: no Python object per step.

:class:`AdaptiveColumns` is a run-length encoded list of
:class:`~.adaptive_steps.AdaptiveStep` records (Adam, AdamW, ... settings and the noise they
saw) as one numpy array per field of :data:`~.adaptive_steps.ADAPTIVE_STEP_FIELDS` and one of
run lengths, one element per run of identical steps; :class:`AdaptiveStepTrace` is the
growable form (a run added in amortised O(1)) that both the accountant's trace and
:class:`~opacus_lastiterate.analysis.kept_model.KeptModel` keep. A cosine schedule changes the
learning rate at every step, so a run of T steps has T entries: kept as objects they cost
about 0.75 kB a step, as columns about 90 bytes, and in the trace, where each field is
run-length encoded on its own, about 24.

The columns are trusted: they come from validated :class:`AdaptiveStep` objects
(:meth:`AdaptiveColumns.from_runs`) or from a stored trace validated whole when it was decoded.
:func:`adaptive_columns_weights` gives the weights w_t of a run from its columns and
:func:`adaptive_columns_caveats` its caveats (what
:func:`~.adaptive_steps.adaptive_run_weights` and :func:`~.adaptive_steps.adaptive_run_caveats`
give for a list of objects), and
:meth:`~.adaptive_steps.SGDEquivalent.extend` the SGD equivalent of an Adam or AdamW run
from them, vectorised.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from opacus_lastiterate.analysis.last_iterate.adaptive_arrays import StepArrays, array_weights
from opacus_lastiterate.analysis.last_iterate.adaptive_regime import adaptive_heuristic_caveats
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    ADAPTIVE_STEP_FIELDS,
    AdaptiveStep,
)

__all__: list[str] = []  # internals of KeptModel and of the accountant's trace

_FLAGS = ("decoupled_weight_decay", "amsgrad", "centered")
_DTYPES = tuple(
    object if f == "optimizer" else bool if f in _FLAGS else np.float64
    for f in ADAPTIVE_STEP_FIELDS
)
"""The dtype of each field's column, in the order of :data:`ADAPTIVE_STEP_FIELDS`."""


class AdaptiveColumns(NamedTuple):
    """Run-length encoded adaptive steps, one numpy array per field (in the order of
    :data:`~.adaptive_steps.ADAPTIVE_STEP_FIELDS`) and the run lengths, one element per run."""

    optimizer: np.ndarray
    lr: np.ndarray
    beta1: np.ndarray
    beta2: np.ndarray
    eps: np.ndarray
    weight_decay: np.ndarray
    decoupled_weight_decay: np.ndarray
    amsgrad: np.ndarray
    centered: np.ndarray
    lr_decay: np.ndarray
    initial_accumulator_value: np.ndarray
    momentum_decay: np.ndarray
    noise_std: np.ndarray
    steps: np.ndarray

    @classmethod
    def from_runs(cls, runs: Sequence[tuple[AdaptiveStep, int]]) -> AdaptiveColumns:
        """The columns of (step, number of steps) pairs, oldest first (runs of 0 steps
        left out)."""
        kept = [(step.as_tuple(), int(n)) for step, n in runs if n > 0]
        rows = list(zip(*(values for values, _ in kept), strict=True)) or [()] * len(_DTYPES)
        return cls._make((
            *(np.array(column, dtype=d) for column, d in zip(rows, _DTYPES, strict=True)),
            np.array([n for _, n in kept], dtype=np.int64),
        ))  # fmt: skip

    @property
    def fields(self) -> tuple[np.ndarray, ...]:
        """The columns of the fields, without the run lengths."""
        return tuple(self)[:-1]

    def step_at(self, i: int) -> AdaptiveStep:
        """The step of run ``i`` (one new object)."""
        return AdaptiveStep.from_tuple([c[i : i + 1].tolist()[0] for c in self.fields])

    def runs(self) -> list[tuple[AdaptiveStep, int]]:
        """(step, number of steps) pairs, oldest first (one new object per run)."""
        rows = zip(*(c.tolist() for c in self.fields), strict=True)
        return [
            (AdaptiveStep.from_tuple(row), n)
            for row, n in zip(rows, self.steps.tolist(), strict=True)
        ]

    def without_empty(self) -> AdaptiveColumns:
        """The columns without their runs of 0 steps."""
        keep = self.steps > 0
        return self if keep.all() else AdaptiveColumns._make(c[keep] for c in self)


class AdaptiveStepTrace:
    """Run-length encoded :class:`~.adaptive_steps.AdaptiveStep` records, with the steps they
    cover, each field kept run-length encoded over the runs on its own in growable numpy
    columns (its values where it changes and the run at which each starts): a run added in
    amortised O(1), and a field that stays put (most of them: the betas, eps, weight decay,
    the options) costs one value, not one per run. Under a cosine schedule a run of T steps
    holds about 24 bytes a step (the learning rate, its start and the run length).

    Args:
        runs: what to start from: (step, number of steps) pairs, oldest first, or
            :class:`AdaptiveColumns` (trusted), or None for none.
    """

    def __init__(
        self, runs: Sequence[tuple[AdaptiveStep, int]] | AdaptiveColumns | None = None
    ) -> None:
        self._values = [np.empty(16, dtype=d) for d in _DTYPES]  # each field's values
        self._starts = [np.empty(16, dtype=np.int64) for _ in _DTYPES]  # from which run
        self._used = [0] * len(_DTYPES)
        self._steps = np.empty(16, dtype=np.int64)
        self._n = self._covered = 0
        self._last: AdaptiveStep | None = None
        self._last_row: tuple[object, ...] = ()
        if isinstance(runs, AdaptiveColumns):
            runs = runs.without_empty()
            n = len(runs.steps)
            if n:
                for i, column in enumerate(runs.fields):
                    starts = np.flatnonzero(np.append(True, column[1:] != column[:-1]))
                    self._values[i], self._starts[i] = column[starts], starts.astype(np.int64)
                    self._used[i] = len(starts)
                self._steps = np.array(runs.steps, dtype=np.int64)
                self._n, self._covered = n, int(runs.steps.sum())
                self._last = runs.step_at(n - 1)
                self._last_row = self._last.as_tuple()
            return
        for step, k in runs or []:
            if k > 0:
                self.append(step, int(k))

    def __len__(self) -> int:
        return self._n

    @property
    def covered(self) -> int:
        """The number of steps the trace covers."""
        return self._covered

    @property
    def last(self) -> AdaptiveStep | None:
        """The step of the last run."""
        return self._last

    @property
    def steps(self) -> np.ndarray:
        """The number of steps of each run (a view: read it, do not write it)."""
        return self._steps[: self._n]

    def append(self, step: AdaptiveStep, steps: int = 1) -> None:
        """Add ``steps`` steps recorded as ``step``."""
        self._covered += steps
        n = self._n
        if self._last == step:
            self._steps[n - 1] += steps
            return
        row = step.as_tuple()
        last = self._last_row
        for i, value in enumerate(row):
            if not last or value != last[i]:  # the field changes: a new value
                used = self._used[i]
                if used == len(self._values[i]):
                    more = max(16, used)
                    self._values[i] = np.concatenate((self._values[i], np.empty(more, _DTYPES[i])))
                    self._starts[i] = np.concatenate((self._starts[i], np.empty(more, np.int64)))
                self._values[i][used], self._starts[i][used] = value, n
                self._used[i] = used + 1
        if n == len(self._steps):
            self._steps = np.concatenate((self._steps, np.empty(max(16, n), np.int64)))
        self._steps[n] = steps
        self._n, self._last, self._last_row = n + 1, step, row

    def columns(self) -> AdaptiveColumns:
        """The runs as columns, one element per run (new arrays, but the run lengths: a view,
        read it, do not write it)."""
        n = self._n
        fields = []
        for values, starts, used in zip(self._values, self._starts, self._used, strict=True):
            counts = np.diff(np.append(starts[:used], n))
            fields.append(np.repeat(values[:used], counts))
        return AdaptiveColumns._make((*fields, self._steps[:n]))

    def runs(self) -> list[tuple[AdaptiveStep, int]]:
        """(step, number of steps) pairs, oldest first (one new object per run)."""
        return self.columns().runs()


def adaptive_columns_caveats(
    columns: AdaptiveColumns,
    noise_multipliers: Sequence[float] | np.ndarray,
    sample_rates: Sequence[float] | np.ndarray,
) -> tuple[str, ...]:
    """The caveats (:func:`~.adaptive_regime.adaptive_heuristic_caveats`) of a recorded run
    given as columns: what :func:`~.adaptive_steps.adaptive_run_caveats` gives for its runs
    (largest sample rate, smallest noise multiplier > 0, extreme betas, largest
    eps / noise_std), in numpy. ``()`` for an empty run."""
    columns = columns.without_empty()
    if not len(columns.steps):
        return ()
    sigma = np.asarray(noise_multipliers, dtype=float)
    positive = sigma[sigma > 0]
    if positive.size == 0:
        return ()
    beta1, beta2 = columns.beta1, columns.beta2
    top1, top2 = float(beta1.max()), float(beta2.max())
    return adaptive_heuristic_caveats(
        str(columns.optimizer[0]),
        sample_rate=float(np.max(sample_rates)),
        noise_multiplier=float(positive.min()),
        steps=int(columns.steps.sum()),
        beta1=top1 if top1 > 0.9 else float(beta1.min()),
        beta2=top2 if top2 > 0.999 else float(beta2.min()),
        eps_over_noise=float((columns.eps / columns.noise_std).max()),
    )


def adaptive_columns_weights(columns: AdaptiveColumns) -> np.ndarray:
    """The weights w_1..w_T of a run given as columns: those of
    :func:`~.adaptive_steps.adaptive_run_weights` for its runs, bit for bit, computed in numpy
    (:func:`~.adaptive_arrays.array_weights`) with no Python object per step or run.

    Raises:
        ValueError: the optimizer or one of its options changes during the run, or a step
            divides by a zero second moment.
    """
    columns = columns.without_empty()
    counts = columns.steps
    if not len(counts):
        return np.zeros(0)
    for field in ("optimizer", *_FLAGS):
        column = getattr(columns, field)
        changed = np.flatnonzero(column != column[0])
        if changed.size:
            step = int(counts[: int(changed[0])].sum())
            raise ValueError(
                f"`settings[{step}].{field}` is {column[changed[0]]!r} but `settings[0].{field}` "
                f"is {column[0]!r}: one run uses one optimizer with the same options throughout."
            )
    arrays = StepArrays._make(np.repeat(getattr(columns, f), counts) for f in StepArrays._fields)
    return array_weights(
        str(columns.optimizer[0]), bool(columns.decoupled_weight_decay[0]),
        bool(columns.amsgrad[0]), bool(columns.centered[0]), arrays,
        np.repeat(columns.noise_std, counts),
    )  # fmt: skip
