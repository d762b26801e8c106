"""False-positive / false-negative counts of threshold tests on attack scores.

Convention (``docs/auditing.md``, "Pipeline (multi-run)"): a higher score means "canary was
in"; the test with threshold t says "in" when ``score >= t``. Then

    FP(t) = #{out-scores >= t},   FN(t) = #{in-scores < t}.

The curve over thresholds is what an audit report should show next to its bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis.audit._arrays import check_scores

__all__ = [
    "ErrorCurve",
    "error_curve",
]


def _readonly(a: NDArray) -> NDArray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True, eq=False)
class ErrorCurve:
    """Counts of the threshold tests at every observed score (ascending thresholds).

    Attributes:
        thresholds: the distinct observed scores, ascending.
        false_positives: FP at each threshold (non-increasing).
        false_negatives: FN at each threshold (non-decreasing).
        num_in: number of in-scores (runs or canaries with the canary included).
        num_out: number of out-scores.
    """

    thresholds: NDArray[np.float64]
    false_positives: NDArray[np.int64]
    false_negatives: NDArray[np.int64]
    num_in: int
    num_out: int

    @property
    def false_positive_rates(self) -> NDArray[np.float64]:
        """FP / num_out at each threshold (point estimates, not bounds)."""
        return self.false_positives / self.num_out

    @property
    def false_negative_rates(self) -> NDArray[np.float64]:
        """FN / num_in at each threshold (point estimates, not bounds)."""
        return self.false_negatives / self.num_in


def counts_at(
    in_sorted: NDArray[np.float64], out_sorted: NDArray[np.float64], thresholds: NDArray[np.float64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(FP, FN) at ``thresholds`` for *sorted* score arrays (package-internal, unchecked)."""
    fn = np.searchsorted(in_sorted, thresholds, side="left").astype(np.int64)
    fp = (out_sorted.size - np.searchsorted(out_sorted, thresholds, side="left")).astype(np.int64)
    return fp, fn


def error_curve(in_scores: ArrayLike, out_scores: ArrayLike) -> ErrorCurve:
    """FP and FN of the test "in iff score >= t" for every distinct observed score t."""
    ins = np.sort(check_scores("in_scores", in_scores))
    outs = np.sort(check_scores("out_scores", out_scores))
    thresholds = np.unique(np.concatenate([ins, outs]))
    fp, fn = counts_at(ins, outs, thresholds)
    return ErrorCurve(_readonly(thresholds), _readonly(fp), _readonly(fn), ins.size, outs.size)
