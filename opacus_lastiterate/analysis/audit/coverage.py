"""Coverage of audit statistics: how often each exceeds the true epsilon of a known mechanism.

A lower bound at confidence 1 - a must exceed the truth in at most a fraction a of repeated
audits. :func:`audit_statistics` names the statistics the package computes from scores (and
the published one); :func:`exceedance_simulated` repeats an audit on fresh scores of a
known pair and counts exceedances (with the binomial standard error of the count);
:func:`exceedance_exact_binary` sums over the counts exactly when the scores take two
values (randomised response: every statistic is a function of the two counts of ones).

The true epsilon of the pairs used by ``scripts/audit_coverage_study.py``
(``docs/input_audit_protocols.md``, "Coverage"):

- Gaussian pair N(0, 1) vs N(mu, 1): mu-GDP exactly, epsilon(delta) from
  :func:`~opacus_lastiterate.analysis.baselines.gaussian_mechanism.gaussian_epsilon`;
- randomised response with p = e^e0 / (1 + e^e0) (in-scores Bernoulli(p), out-scores
  Bernoulli(1 - p)): epsilon(delta) = log((p - delta) / (1 - p)) (:func:`rr_true_epsilon`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from opacus_lastiterate.analysis._validation import check_in_interval, check_int
from opacus_lastiterate.analysis.audit.published import published_gdp_epsilon
from opacus_lastiterate.analysis.audit.score_audit import ScoreAudit
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    Bonferroni,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    RankGridBonferroni,
)

__all__ = []

Statistic = Callable[[np.ndarray, np.ndarray, np.random.Generator], float]

#: name -> (label the package gives it, needs a random generator)
COVERAGE_STATISTICS: dict[str, str] = {
    "as published (max over thresholds, GDP)": "invalid",
    "gaussian-dp, Bonferroni": "estimate",
    "gaussian-dp, rank grid": "estimate",
    "clopper-pearson, rank grid (default)": "bound",
    "clopper-pearson, Bonferroni": "bound",
    "clopper-pearson, held-out split": "bound",
    "clopper-pearson, multi-split (11)": "bound",
    "clopper-pearson, naive max": "invalid",
}
"""The multi-run statistics of the study and the label (``AuditResult.kind``) the package
gives each."""


def rr_true_epsilon(epsilon0: float, delta: float) -> float:
    """True epsilon(delta) of randomised response with parameter ``epsilon0``."""
    p = math.exp(epsilon0) / (1.0 + math.exp(epsilon0))
    return math.log((p - delta) / (1.0 - p)) if delta < p else 0.0


def audit_statistics(delta: float, confidence: float = 0.95) -> dict[str, Statistic]:
    """Every statistic of :data:`COVERAGE_STATISTICS` as ``f(ins, outs, rng) -> epsilon``."""
    c = check_in_interval("confidence", confidence, 0.0, 1.0)

    def cp(strategy: Callable[[np.random.Generator], object]) -> Statistic:
        return lambda i, o, rng: ScoreAudit(i, o).clopper_pearson(
            delta=delta, confidence=c, threshold_strategy=strategy(rng)  # type: ignore[arg-type]
        ).epsilon

    def gdp(strategy: object) -> Statistic:
        return lambda i, o, rng: ScoreAudit(i, o).gaussian_dp(
            delta=delta, confidence=c, threshold_strategy=strategy  # type: ignore[arg-type]
        ).epsilon

    def seed(rng: np.random.Generator) -> int:
        return int(rng.integers(2**31))

    return {
        "as published (max over thresholds, GDP)": lambda i, o, rng: published_gdp_epsilon(
            i, o, delta=delta, alpha=1.0 - c
        ).epsilon,
        "gaussian-dp, Bonferroni": gdp(Bonferroni()),
        "gaussian-dp, rank grid": gdp(RankGridBonferroni()),
        "clopper-pearson, rank grid (default)": cp(lambda rng: RankGridBonferroni()),
        "clopper-pearson, Bonferroni": cp(lambda rng: Bonferroni()),
        "clopper-pearson, held-out split": cp(lambda rng: HeldOutSplit(seed=seed(rng))),
        "clopper-pearson, multi-split (11)": cp(
            lambda rng: MultiSplit(num_splits=11, seed=seed(rng))
        ),
        "clopper-pearson, naive max": cp(lambda rng: NaiveMax()),
    }


@dataclass(frozen=True)
class Exceedance:
    """How often a statistic exceeded the truth.

    Attributes:
        rate: the fraction (simulated) or probability (exact) of audits above the truth.
        error: binomial standard error of a simulated rate; for an exact sum, the
            probability mass left out of the sum (the rate is within ``[rate, rate + error]``).
        reps: repetitions (0 for an exact sum).
        method: ``"simulated"`` or ``"exact"``.
    """

    rate: float
    error: float
    reps: int
    method: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {"rate": self.rate, "error": self.error, "reps": self.reps, "method": self.method}


def exceedance_simulated(
    statistics: Mapping[str, Statistic],
    sample: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]],
    truth: Mapping[str, float] | float,
    *,
    reps: int,
    seed: int = 0,
) -> dict[str, Exceedance]:
    """Repeat ``reps`` audits on fresh scores ``sample(rng) -> (ins, outs)``; per statistic,
    the fraction above its truth (a float for all, or one per statistic name)."""
    r = check_int("reps", reps, minimum=1)
    rng = np.random.default_rng(check_int("seed", seed))
    counts = dict.fromkeys(statistics, 0)
    for _ in range(r):
        ins, outs = sample(rng)
        for name, stat in statistics.items():
            t = truth if isinstance(truth, (int, float)) else truth[name]
            counts[name] += stat(ins, outs, rng) > t
    return {
        name: Exceedance(k / r, math.sqrt(max(k / r * (1 - k / r), 1.0 / r) / r), r, "simulated")
        for name, k in counts.items()
    }


def exceedance_exact_binary(
    statistics: Mapping[str, Statistic],
    n_in: int,
    n_out: int,
    p_in: float,
    p_out: float,
    truth: float,
    *,
    tail: float = 1e-9,
) -> dict[str, Exceedance]:
    """Exact Pr[statistic > truth] for 0/1 scores: in-scores Bernoulli(``p_in``), out-scores
    Bernoulli(``p_out``), independent, so the counts of ones are binomial and each
    (deterministic) statistic is a function of them. The sum runs over every pair of counts
    whose binomial probabilities are above ``tail`` on each side; the left-out mass is the
    ``error`` (an upper allowance, not a standard error)."""
    ni = check_int("n_in", n_in, minimum=1)
    no = check_int("n_out", n_out, minimum=1)
    ks_in = np.arange(ni + 1)
    ks_out = np.arange(no + 1)
    w_in = binom.pmf(ks_in, ni, p_in)
    w_out = binom.pmf(ks_out, no, p_out)
    keep_in, keep_out = ks_in[w_in > tail], ks_out[w_out > tail]
    left = 1.0 - w_in[keep_in].sum() * w_out[keep_out].sum()
    rng = np.random.default_rng(0)  # unused by deterministic statistics
    probs = dict.fromkeys(statistics, 0.0)
    for ki in keep_in:
        ins = np.r_[np.zeros(ni - ki), np.ones(ki)]
        for ko in keep_out:
            outs = np.r_[np.zeros(no - ko), np.ones(ko)]
            w = w_in[ki] * w_out[ko]
            for name, stat in statistics.items():
                if stat(ins, outs, rng) > truth:
                    probs[name] += w
    return {name: Exceedance(p, max(left, 0.0), 0, "exact") for name, p in probs.items()}
