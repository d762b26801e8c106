"""How an audit chooses the threshold of its test (``docs/auditing.md``, "Threshold selection").

Choosing the best threshold on the same scores and then applying a (1 - a) interval is not
a (1 - a) procedure (``docs/auditing.md``). The strategies below are valid, except
:class:`NaiveMax`, which exists for comparison with published tools and is labelled as
not statistically valid in every result it produces.

- :class:`RankGridBonferroni` (default): Bonferroni over thresholds at a geometric grid of
  *ranks* fixed before seeing the scores. Multi-run: "in iff score > the (c+1)-th largest
  out-score" (exactly c false positives) and "in iff score >= the (c+1)-th smallest
  in-score" (exactly c false negatives), c in {0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 15, ...}
  (about 2 + ln(n)/ln(growth) per side). At such a threshold the true rate is distributed as
  Beta(c + 1, n - c) (uniform order statistics; stochastically smaller with ties), which is
  exactly the distribution the Clopper-Pearson bound for c successes inverts, and the other
  side's scores are independent of the threshold; so each rate bound fails with probability
  at most a / (2 n_grid). One-run: guess "in" for the top k scores, k on the grid. Tighter
  than :class:`Bonferroni` because the grid has O(log n) points instead of n.
- :class:`Bonferroni`: every candidate threshold, each at significance a / n.
  Without explicit candidates the candidates are the n = n_in + n_out observed scores.
  Validity: at a threshold equal to the j-th largest out-score the FP count is j and the
  true FPR is distributed as Beta(j, n_out - j + 1), stochastically below the
  Clopper-Pearson quantile Beta(j + 1, n_out - j); at an in-score threshold the out-scores
  are independent of the threshold (and symmetrically for FN). Each of the n thresholds
  therefore fails with probability at most a / n, and the union bound applies. (jax_privacy
  divides by the size of a data-dependent Pareto frontier instead; that is smaller, but we
  know no proof that it is valid.)
- :class:`HeldOutSplit`: choose the threshold on a random part, bound on the rest.
- :class:`MultiSplit`: repeat the split, each bound at significance a / 2, report the
  lower median; valid because 2 x (median p-value) is a p-value (Meinshausen, Meier,
  Buehlmann 2009) -- at least half of the bounds exceeding the truth has probability <= a.
- :class:`ExplicitThreshold`: a threshold fixed before seeing the scores.
- :class:`NaiveMax`: the maximum over all thresholds at significance a. NOT valid.

Thresholds may be +inf or -inf ("in" for no score / for every score), e.g. to pass the
threshold set of another tool (jax_privacy's ends with +inf). Each strategy carries its own
``select`` method; a new strategy subclasses :class:`ThresholdStrategy` and implements it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit._selection import (
    Candidates,
    Scores,
    Selected,
    Statistic,
    best,
    choose_on_split,
    observed,
)

__all__ = [
    "Bonferroni",
    "ExplicitThreshold",
    "HeldOutSplit",
    "MultiSplit",
    "NaiveMax",
    "RankGridBonferroni",
    "ThresholdStrategy",
]


def _check_threshold(name: str, value: object) -> float:
    """A real number or +-inf (not NaN, not bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"`{name}` must be a real number (or +-inf), got {value!r}.")
    x = float(value)
    if math.isnan(x):
        raise ValueError(f"`{name}` must be a real number (or +-inf), got nan.")
    return x


class ThresholdStrategy:
    """Base class of the threshold-selection strategies."""

    #: False only for strategies whose confidence level is not honest (:class:`NaiveMax`).
    statistically_valid: ClassVar[bool] = True

    def describe(self) -> str:
        """One line for reports."""
        raise NotImplementedError

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        """The statistic at the chosen threshold; holds with probability >= 1 - significance
        for every valid strategy (``scores`` sorted once by the caller)."""
        raise NotImplementedError


def _check_seed(seed: object) -> int | None:
    return None if seed is None else check_int("seed", seed)


@dataclass(frozen=True)
class RankGridBonferroni(ThresholdStrategy):
    """Bonferroni over thresholds at a geometric grid of ranks (the default; module docs).

    Attributes:
        growth: ratio of the geometric grid of ranks (> 1); the grid is
            ``{0} U {round(growth**i)}`` (multi-run counts) or ``{round(growth**i)} >= 1``
            (one-run guess counts), below the sample size.
    """

    growth: float = 1.25

    def __post_init__(self) -> None:
        check_in_interval("growth", self.growth, 1.0, math.inf)

    def describe(self) -> str:
        return f"Bonferroni over a geometric rank grid (growth {self.growth:g})"

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        ins, outs = scores.ins, scores.outs
        cand = stat.rank_candidates(ins, outs, self.growth)
        n = cand.thresholds.size
        value, t = best(stat, ins, outs, significance / n, cand)
        text = (
            f"Bonferroni over {n} candidate thresholds at a geometric rank grid "
            f"(growth {self.growth:g}), each at significance {significance / n:.3g}"
        )
        return Selected(value, t, stat.counts(ins, outs, t), text)


@dataclass(frozen=True)
class Bonferroni(ThresholdStrategy):
    """All candidate thresholds, each bound at significance ``(1 - confidence) / n``.

    Attributes:
        candidates: thresholds fixed before seeing the scores, +-inf allowed (then
            n = len(candidates), duplicates counted), or None (default) for every observed
            score (then n = n_in + n_out).
    """

    candidates: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.candidates is not None:
            if isinstance(self.candidates, (str, bytes)):
                raise TypeError(
                    f"`candidates` must be a sequence of numbers, got {self.candidates!r}."
                )
            values = tuple(_check_threshold("candidates", c) for c in self.candidates)
            if not values:
                raise ValueError("`candidates` must be non-empty, got an empty sequence.")
            object.__setattr__(self, "candidates", values)

    def describe(self) -> str:
        if self.candidates is None:
            return "Bonferroni over every observed score"
        return f"Bonferroni over {len(self.candidates)} pre-set candidate thresholds"

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        ins, outs = scores.ins, scores.outs
        if self.candidates is not None:
            cand = Candidates(np.unique(np.asarray(self.candidates, dtype=np.float64)))
            n, what = len(self.candidates), "pre-set"
        else:
            cand = observed(ins, outs)
            n, what = ins.size + outs.size, "every observed score"
        value, t = best(stat, ins, outs, significance / n, cand)
        text = (
            f"Bonferroni over {n} candidate thresholds ({what}), each at significance "
            f"{significance / n:.3g}"
        )
        return Selected(value, t, stat.counts(ins, outs, t), text)


@dataclass(frozen=True)
class HeldOutSplit(ThresholdStrategy):
    """Choose the threshold on a random ``selection_fraction`` of each side, bound on the rest.

    In one-run audits the split is drawn over all canaries regardless of label, so that the
    held-out canaries' inclusion remains independent fair coins.

    Attributes:
        selection_fraction: fraction of the in-scores and of the out-scores used to choose.
        seed: seed of the split (None: fresh entropy, not reproducible).
    """

    selection_fraction: float = 0.5
    seed: int | None = 0

    def __post_init__(self) -> None:
        check_in_interval("selection_fraction", self.selection_fraction, 0.0, 1.0)
        _check_seed(self.seed)

    def describe(self) -> str:
        return f"held-out split (choose on {self.selection_fraction:g}, seed {self.seed})"

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        rng = np.random.default_rng(self.seed)
        value, t, ins_eval, outs_eval = choose_on_split(
            stat, scores.raw_ins, scores.raw_outs, self.selection_fraction, rng, significance
        )
        text = (
            f"threshold chosen on a held-out {self.selection_fraction:g} split "
            f"(seed {self.seed}), bound on the other {ins_eval.size} + {outs_eval.size} scores"
        )
        return Selected(value, t, stat.counts(ins_eval, outs_eval, t), text)


@dataclass(frozen=True)
class MultiSplit(ThresholdStrategy):
    """``num_splits`` random held-out splits, each at significance a / 2; lower median reported.

    Attributes:
        num_splits: number of random splits (>= 1).
        selection_fraction: fraction of each side used to choose the threshold.
        seed: seed of the splits (None: fresh entropy, not reproducible).
    """

    num_splits: int = 100
    selection_fraction: float = 0.5
    seed: int | None = 0

    def __post_init__(self) -> None:
        check_int("num_splits", self.num_splits, minimum=1)
        check_in_interval("selection_fraction", self.selection_fraction, 0.0, 1.0)
        _check_seed(self.seed)

    def describe(self) -> str:
        return (
            f"median of {self.num_splits} held-out splits (choose on "
            f"{self.selection_fraction:g}, seed {self.seed})"
        )

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        rng = np.random.default_rng(self.seed)
        half = 0.5 * significance
        results = [
            choose_on_split(
                stat, scores.raw_ins, scores.raw_outs, self.selection_fraction, rng, half
            )
            for _ in range(self.num_splits)
        ]
        order = sorted(range(len(results)), key=lambda j: results[j][0])
        value, t, ins_eval, outs_eval = results[order[math.ceil(len(results) / 2) - 1]]
        text = (
            f"lower median of {self.num_splits} held-out splits "
            f"(choose on {self.selection_fraction:g}, seed {self.seed}), "
            f"each at significance {half:.3g}"
        )
        return Selected(value, t, stat.counts(ins_eval, outs_eval, t), text)


@dataclass(frozen=True)
class ExplicitThreshold(ThresholdStrategy):
    """A threshold fixed before the scores were seen (test says "in" iff score >= threshold;
    +-inf allowed)."""

    threshold: float

    def __post_init__(self) -> None:
        _check_threshold("threshold", self.threshold)

    def describe(self) -> str:
        return f"threshold {self.threshold:g} fixed in advance"

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        t = float(self.threshold)
        value = stat.at(scores.ins, scores.outs, significance, t)
        return Selected(value, t, stat.counts(scores.ins, scores.outs, t), self.describe())


@dataclass(frozen=True)
class NaiveMax(ThresholdStrategy):
    """Best threshold chosen on the same scores, no correction. NOT statistically valid.

    Offered only to reproduce published tools (bb-audit-dpsgd, TF-privacy, ML Privacy
    Meter); its failure rate exceeds the nominal one (``docs/auditing.md``,
    "Threshold selection").
    """

    statistically_valid: ClassVar[bool] = False

    def describe(self) -> str:
        return "naive maximum over thresholds on the same scores (NOT statistically valid)"

    def select(self, stat: Statistic, scores: Scores, significance: float) -> Selected:
        ins, outs = scores.ins, scores.outs
        value, t = best(stat, ins, outs, significance, observed(ins, outs))
        return Selected(value, t, stat.counts(ins, outs, t), self.describe())


#: The strategy every audit uses unless told otherwise.
DEFAULT_THRESHOLD_STRATEGY: ThresholdStrategy = RankGridBonferroni()
