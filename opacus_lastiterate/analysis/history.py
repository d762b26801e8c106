"""Training histories: the sequence of (noise_multiplier, sample_rate, steps) segments.

This is the form in which Opacus accountants store what happened (``accountant.history``),
run-length compressed. Units are multiples of the clipping norm C throughout.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opacus_lastiterate.analysis._validation import (
    check_noise_multiplier,
    check_sample_rate,
    check_steps,
)

__all__ = ["HistoryLike", "TrainingSegment", "as_segments", "suffix", "total_steps"]


@dataclass(frozen=True)
class TrainingSegment:
    """``steps`` consecutive DP-SGD steps with Poisson rate ``sample_rate`` and noise
    standard deviation ``noise_multiplier`` (in units of the clipping norm)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_noise_multiplier(self.noise_multiplier))
        object.__setattr__(self, "sample_rate", check_sample_rate(self.sample_rate))
        object.__setattr__(self, "steps", check_steps(self.steps))


HistoryLike = Sequence[TrainingSegment] | Sequence[Sequence[float]] | Iterable[object]


def as_segments(history: HistoryLike, name: str = "history") -> tuple[TrainingSegment, ...]:
    """Validate a history and return it as a tuple of :class:`TrainingSegment`.

    Accepts segments or Opacus-style triples ``(noise_multiplier, sample_rate, steps)``.
    Raises ``TypeError``/``ValueError`` naming the offending entry.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Iterable):
        raise TypeError(
            f"`{name}` must be a sequence of (noise_multiplier, sample_rate, steps), "
            f"got {history!r}."
        )
    out = []
    for i, entry in enumerate(history):
        if isinstance(entry, TrainingSegment):
            out.append(entry)
            continue
        sigma: object
        q: object
        steps: object
        try:
            sigma, q, steps = entry  # type: ignore[misc]
        except (TypeError, ValueError):
            raise TypeError(
                f"`{name}[{i}]` must be a (noise_multiplier, sample_rate, steps) triple, "
                f"got {entry!r}."
            ) from None
        out.append(
            TrainingSegment(
                noise_multiplier=check_noise_multiplier(sigma, f"{name}[{i}].noise_multiplier"),
                sample_rate=check_sample_rate(q, f"{name}[{i}].sample_rate"),
                steps=check_steps(steps, f"{name}[{i}].steps"),
            )
        )
    return tuple(out)


def total_steps(segments: Sequence[TrainingSegment]) -> int:
    """Total number of steps in a validated history."""
    return sum(s.steps for s in segments)


def suffix(segments: Sequence[TrainingSegment], steps: int) -> tuple[TrainingSegment, ...]:
    """The last ``steps`` steps of a history (the part a zeroing regulariser keeps)."""
    out: list[TrainingSegment] = []
    remaining = steps
    for seg in reversed(segments):
        if remaining <= 0:
            break
        take = min(seg.steps, remaining)
        if take > 0:
            out.append(TrainingSegment(seg.noise_multiplier, seg.sample_rate, take))
        remaining -= take
    return tuple(reversed(out))
