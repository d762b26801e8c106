"""When a gradient canary enters the batch: Poisson-sampled at a rate, or every k steps.

``docs/auditing.md``, "Adversaries": the canary is either sampled like every other record
(Poisson at the training rate q, the setting of the last-iterate heuristic) or inserted
deterministically every ``period`` steps (Cebere et al., insertion periodicity k).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from opacus_lastiterate.analysis._validation import check_int, check_sample_rate

__all__ = [
    "Insertion",
    "PoissonInsertion",
]


def check_rng(rng: object) -> np.random.Generator:
    """``rng`` must be a ``numpy.random.Generator`` (seeded by the caller)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"`rng` must be a numpy.random.Generator, got {type(rng).__name__}.")
    return rng


class Insertion:
    """Base class: which of the ``steps`` steps contain the canary, per trial."""

    def draw_step(self, rng: np.random.Generator, step: int, trials: int) -> NDArray[np.bool_]:
        """Presence of the canary at ``step`` (0-based) in each of ``trials`` runs."""
        raise NotImplementedError

    def mask(self, rng: np.random.Generator, trials: int, steps: int) -> NDArray[np.bool_]:
        """Presence at every step, shape ``(trials, steps)`` (memory ``trials * steps``)."""
        check_rng(rng)
        return np.stack([self.draw_step(rng, t, trials) for t in range(steps)], axis=1)

    def count(self, rng: np.random.Generator, trials: int, steps: int) -> NDArray[np.int64]:
        """Number of steps containing the canary, drawn directly (no per-step loop)."""
        raise NotImplementedError

    def presence_probabilities(self, steps: int) -> NDArray[np.float64]:
        """Probability that step t (0-based) contains the canary, shape ``(steps,)``."""
        raise NotImplementedError


@dataclass(frozen=True)
class PoissonInsertion(Insertion):
    """Each step contains the canary independently with probability ``sample_rate``.

    The number of steps with the canary is ``Binomial(steps, sample_rate)``.
    """

    sample_rate: float

    def __post_init__(self) -> None:
        check_sample_rate(self.sample_rate)

    def draw_step(self, rng: np.random.Generator, step: int, trials: int) -> NDArray[np.bool_]:
        check_rng(rng)
        return rng.random(check_int("trials", trials)) < self.sample_rate

    def count(self, rng: np.random.Generator, trials: int, steps: int) -> NDArray[np.int64]:
        check_rng(rng)
        n = check_int("trials", trials)
        return rng.binomial(check_int("steps", steps), self.sample_rate, n).astype(np.int64)

    def presence_probabilities(self, steps: int) -> NDArray[np.float64]:
        return np.full(check_int("steps", steps), self.sample_rate)


@dataclass(frozen=True)
class PeriodicInsertion(Insertion):
    """The canary is in steps ``offset, offset + period, offset + 2 period, ...`` (0-based).

    ``period = 1`` inserts it at every step (Cebere et al., k = 1).
    """

    period: int
    offset: int = 0

    def __post_init__(self) -> None:
        check_int("period", self.period, minimum=1)
        check_int("offset", self.offset)
        if self.offset >= self.period:
            raise ValueError(f"`offset` must be in [0, {self.period - 1}], got {self.offset}.")

    def _present(self, step: int) -> bool:
        return step >= self.offset and (step - self.offset) % self.period == 0

    def draw_step(self, rng: np.random.Generator, step: int, trials: int) -> NDArray[np.bool_]:
        return np.full(check_int("trials", trials), self._present(check_int("step", step)))

    def count(self, rng: np.random.Generator, trials: int, steps: int) -> NDArray[np.int64]:
        n = check_int("trials", trials)
        t = check_int("steps", steps)
        k = 0 if t <= self.offset else (t - 1 - self.offset) // self.period + 1
        return np.full(n, k, dtype=np.int64)

    def presence_probabilities(self, steps: int) -> NDArray[np.float64]:
        return np.array([float(self._present(t)) for t in range(check_int("steps", steps))])
