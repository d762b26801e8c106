"""Compatibility alias: run descriptions live in :mod:`opacus_lastiterate.analysis.run`."""

from __future__ import annotations

from collections.abc import Sequence

from opacus_lastiterate.analysis.run import HistoryLike, TrainingSegment, as_segments

__all__ = ["HistoryLike", "TrainingSegment", "as_segments", "suffix", "total_steps"]


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
            out.append(TrainingSegment._trusted(seg.noise_multiplier, seg.sample_rate, take))
        remaining -= take
    return tuple(reversed(out))
