"""The contract of a many-run audit: what ``train`` and ``score`` are, which run gets which
coin and seed, and how one run is executed (in this process or in a worker).

Run ``i``'s coin and training seed come from ``numpy.random.SeedSequence(seed,
spawn_key=(i,))`` (:func:`run_assignment`): they depend on the master seed and ``i`` only.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from collections.abc import Generator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from opacus_lastiterate.analysis._validation import check_int, check_real

__all__ = [
    "ScoreFunction",
    "TrainFunction",
]

_SEED_BOUND = 2**31  # training seeds lie in [0, 2**31): valid for numpy, torch and random


@runtime_checkable
class TrainFunction(Protocol):
    """Trains one model on D (``include_canary=False``) or D' and returns the final model.

    All randomness (initialisation excepted, if it is fixed on purpose) must come from
    ``seed``, so that a run can be repeated. Must be picklable (a top-level function or an
    instance of a top-level class) for the process pool and Ray. ``isinstance`` checks only
    that an object is callable; :class:`AuditRunner` also checks that it accepts the two
    positional arguments.
    """

    def __call__(self, include_canary: bool, seed: int) -> Any: ...


@runtime_checkable
class ScoreFunction(Protocol):
    """Scores a final model: a finite real number, higher meaning "the canary was in".

    :class:`AuditRunner` checks that it accepts one positional argument.
    """

    def __call__(self, model: Any) -> float: ...


def _check_signature(name: str, fn: object, params: Sequence[str]) -> None:
    """Raise TypeError unless ``fn`` is callable as ``fn(*params)`` (positional arguments).

    Callables whose signature Python cannot inspect (some builtins, C extensions) pass.
    """
    call = f"{name}({', '.join(params)})"
    if not callable(fn):
        raise TypeError(f"`{name}` must be callable as {call}, got {fn!r}.")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*params)
    except TypeError as exc:
        raise TypeError(
            f"`{name}` must be callable as {call} with {len(params)} positional "
            f"argument{'s' if len(params) > 1 else ''}, got {fn!r} with signature {sig} "
            f"({exc})."
        ) from None


# --------------------------------------------------------------------------- configuration


def run_assignment(seed: int, index: int) -> tuple[int, bool]:
    """``(training seed, include_canary)`` of run ``index`` of an audit with master ``seed``.

    Drawn from ``numpy.random.default_rng(SeedSequence(seed, spawn_key=(index,)))``: the coin
    is a fair ``integers(0, 2)``, the training seed is uniform in [0, 2**31).
    """
    s = check_int("seed", seed)
    i = check_int("index", index)
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(i,)))
    include = bool(rng.integers(0, 2))
    train_seed = int(rng.integers(0, _SEED_BOUND))
    return train_seed, include


# --------------------------------------------------------------------------- execution


def _checked_score(value: Any, index: int) -> float:
    name = f"score of run {index}"
    if hasattr(value, "item") and not isinstance(value, (int, float)):
        value = value.item()  # numpy / torch scalars
    x = check_real(name, value)
    if not math.isfinite(x):
        raise ValueError(f"`{name}` must be finite, got {x!r}.")
    return x


def _execute_run(
    train: TrainFunction, score: ScoreFunction, index: int, seed: int, include_canary: bool
) -> tuple[int, float]:
    """Train and score one run (runs in a worker)."""
    model = train(include_canary, seed)
    return index, _checked_score(score(model), index)


def _init_worker(threads: int | None) -> None:
    """Limit this worker's intra-op threads (process-pool initializer, start of a Ray run)."""
    if threads is None:
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


Task = tuple[int, int, bool]  # (index, seed, include_canary)


def _serial(
    train: TrainFunction, score: ScoreFunction, tasks: Sequence[Task]
) -> Generator[tuple[int, float], None, None]:
    for index, seed, include in tasks:
        yield _execute_run(train, score, index, seed, include)
