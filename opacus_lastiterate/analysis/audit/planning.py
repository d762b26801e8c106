"""Size an audit before training: the best epsilon lower bound a given budget can reach.

"Best" means perfect separation: the attack is right on every run (multi-run) or on every
guessed canary (one-run). Any real attack does worse, so if the planned number is below the
epsilon you hope to detect (e.g. the heuristic epsilon), the audit cannot detect it.

- Multi-run (``docs/auditing.md``, "Planning" and "Reference values"): R runs, R // 2
  without and R - R // 2 with the canary (a fair-coin design has about as many),
  FP = FN = 0, Clopper-Pearson at
  the significance the threshold strategy uses, pure (eps, delta) conversion. Rule of
  thumb with a pre-set threshold: eps_max ~ ln(n / ln(2 / a)), n runs per side.
- One-run (same sections): m canaries, r guesses all correct; with delta = 0 this is the
  saturation value ln(a^(1/r) / (1 - a^(1/r))). For the score-level audit, which only
  guesses "in", r is at most the number of included canaries, about m / 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opacus_lastiterate.analysis._validation import (
    check_epsilon,
    check_in_interval,
    check_int,
)
from opacus_lastiterate.analysis.audit._selection import rank_grid
from opacus_lastiterate.analysis.audit.clopper_pearson import upper_at_significance
from opacus_lastiterate.analysis.audit.one_run import epsilon_search, warn_one_run
from opacus_lastiterate.analysis.audit.pure_dp import pure_epsilon
from opacus_lastiterate.analysis.audit.threshold_strategies import (
    DEFAULT_THRESHOLD_STRATEGY,
    Bonferroni,
    ExplicitThreshold,
    HeldOutSplit,
    MultiSplit,
    NaiveMax,
    RankGridBonferroni,
    ThresholdStrategy,
)

__all__ = [
    "AuditPlan",
    "plan_multi_run_audit",
    "plan_one_run_audit",
]

_MAX_CANARIES = 10**6


@dataclass(frozen=True)
class AuditPlan:
    """The best epsilon lower bound an audit of this size can report.

    Attributes:
        epsilon: best achievable lower bound (perfect separation).
        delta: delta of the bound.
        confidence: confidence of the bound.
        method: ``"clopper-pearson"`` (multi-run) or ``"one-run"``.
        sample_size: R runs or m canaries.
        threshold_strategy: the strategy the audit will use (None: pre-set guess count).
        assumption: what "perfect separation" meant here, in words.
        statistically_valid: False if the strategy is :class:`NaiveMax`.
    """

    epsilon: float
    delta: float
    confidence: float
    method: str
    sample_size: int
    threshold_strategy: ThresholdStrategy | None
    assumption: str
    statistically_valid: bool = True

    def __str__(self) -> str:
        unit = "runs" if self.method == "clopper-pearson" else "canaries"
        text = (
            f"best possible {self.method} lower bound with {self.sample_size} {unit}: "
            f"epsilon >= {self.epsilon:.4g} at delta = {self.delta:g} "
            f"({100 * self.confidence:.4g}% confidence; {self.assumption})"
        )
        return text if self.statistically_valid else "NOT STATISTICALLY VALID: " + text


def _split_sizes(n: int, fraction: float) -> int:
    """Evaluation size of one side under the split strategies (as in the audit)."""
    k = min(max(round(fraction * n), 1), n - 1)
    return n - k


def _check_strategy(strategy: object) -> ThresholdStrategy:
    if not isinstance(strategy, ThresholdStrategy):
        raise TypeError(f"`threshold_strategy` must be a ThresholdStrategy, got {strategy!r}.")
    return strategy


def _multi_run_epsilon(
    num_runs: int, delta: float, significance: float, strategy: ThresholdStrategy
) -> tuple[float, str]:
    n_out = num_runs // 2
    n_in = num_runs - n_out
    if isinstance(strategy, RankGridBonferroni):
        divisor = len(rank_grid(n_out, strategy.growth, include_zero=True)) + len(
            rank_grid(n_in, strategy.growth, include_zero=True)
        )
    elif isinstance(strategy, Bonferroni):
        divisor = num_runs if strategy.candidates is None else len(strategy.candidates)
    elif isinstance(strategy, (ExplicitThreshold, NaiveMax)):
        divisor = 1
    elif isinstance(strategy, (HeldOutSplit, MultiSplit)):
        if n_out < 2:
            raise ValueError(f"a split strategy needs `num_runs` >= 4, got {num_runs}.")
        n_out = _split_sizes(n_out, strategy.selection_fraction)
        n_in = _split_sizes(n_in, strategy.selection_fraction)
        divisor = 2 if isinstance(strategy, MultiSplit) else 1
    else:
        raise TypeError(f"`threshold_strategy` must be a ThresholdStrategy, got {strategy!r}.")
    half = 0.5 * significance / divisor
    a = upper_at_significance(np.array([0]), n_out, half)
    b = upper_at_significance(np.array([0]), n_in, half)
    what = f"FP = 0 of {n_out}, FN = 0 of {n_in}; {strategy.describe()}"
    return float(pure_epsilon(a, b, delta)[0]), what


def plan_multi_run_audit(
    num_runs: int,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditPlan:
    """Best Clopper-Pearson epsilon lower bound from ``num_runs`` training runs.

    Perfect separation (FP = FN = 0) at the significance ``threshold_strategy`` would use:
    ``(1 - confidence) / 2`` per rate for a pre-set threshold, divided further by the number
    of candidates for the Bonferroni strategies; the split strategies keep only the held-out
    runs (and :class:`MultiSplit` halves the significance).
    """
    r = check_int("num_runs", num_runs, minimum=2)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    strategy = _check_strategy(threshold_strategy)
    eps, what = _multi_run_epsilon(r, d, 1.0 - c, strategy)
    return AuditPlan(
        eps,
        d,
        c,
        "clopper-pearson",
        r,
        strategy,
        "perfect separation: " + what,
        strategy.statistically_valid,
    )


def _one_run_epsilon(
    m: int,
    delta: float,
    significance: float,
    strategy: ThresholdStrategy | None,
    num_guesses: int | None,
) -> tuple[float, str]:
    if num_guesses is not None:
        eps = epsilon_search(m, num_guesses, num_guesses, significance, delta)
        return eps, f"{num_guesses} guesses fixed in advance, all correct"
    n_in = m // 2
    m_eval, ks, divisor = m, [n_in], 1
    if isinstance(strategy, RankGridBonferroni):
        grid = rank_grid(m, strategy.growth, include_zero=False)
        ks, divisor = [k for k in grid if k <= n_in] or [0], len(grid)
    elif isinstance(strategy, Bonferroni):
        divisor = m if strategy.candidates is None else len(strategy.candidates)
    elif isinstance(strategy, (ExplicitThreshold, NaiveMax)):
        pass
    elif isinstance(strategy, (HeldOutSplit, MultiSplit)):
        if n_in < 2:
            raise ValueError(f"a split strategy needs `num_canaries` >= 4, got {m}.")
        ins = _split_sizes(n_in, strategy.selection_fraction)
        m_eval = ins + _split_sizes(m - n_in, strategy.selection_fraction)
        ks, divisor = [ins], (2 if isinstance(strategy, MultiSplit) else 1)
    else:
        raise TypeError(f"`threshold_strategy` must be a ThresholdStrategy, got {strategy!r}.")
    sig = significance / divisor
    eps = max(epsilon_search(m_eval, k, k, sig, delta) for k in ks)
    what = (
        f"{m // 2} of {m} canaries included, every guess of the top-k correct; "
        f"{strategy.describe()}"  # type: ignore[union-attr]
    )
    return eps, what


def plan_one_run_audit(
    num_canaries: int,
    *,
    delta: float,
    confidence: float = 0.95,
    num_guesses: int | None = None,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> AuditPlan:
    """Best one-run epsilon lower bound with ``num_canaries`` canaries.

    With ``num_guesses`` = r: r guesses fixed in advance, all correct (e.g. r = m when the
    auditor guesses "in" and "out" on every canary and is always right). Otherwise: what
    :func:`~opacus_lastiterate.analysis.audit.audit_one_run` reports with
    ``threshold_strategy`` when m // 2 canaries are in and the attack ranks them all first.
    Warns :class:`OneRunDeltaWarning` when ``2 m delta`` is not small.
    """
    m = check_int("num_canaries", num_canaries, minimum=2)
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    r = None
    if num_guesses is not None:
        r = check_int("num_guesses", num_guesses, minimum=1)
        if r > m:
            raise ValueError(f"`num_guesses` must be in [1, {m}], got {r}.")
        strategy: ThresholdStrategy | None = None
    else:
        strategy = _check_strategy(threshold_strategy)
    warn_one_run(m, d, True)
    eps, what = _one_run_epsilon(m, d, 1.0 - c, strategy, r)
    valid = strategy is None or strategy.statistically_valid
    return AuditPlan(eps, d, c, "one-run", m, strategy, "perfect separation: " + what, valid)


def _smallest(predicate, lo: int, hi_cap: int) -> int | None:
    """Smallest n in [lo, hi_cap] with predicate(n), by doubling then bisection."""
    prev, n = lo - 1, lo
    while not predicate(n):
        if n >= hi_cap:
            return None
        prev, n = n, min(2 * n, hi_cap)
    while n - prev > 1:
        mid = (prev + n) // 2
        if predicate(mid):
            n = mid
        else:
            prev = mid
    return n


def canaries_needed(
    target_epsilon: float,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
) -> int:
    """Smallest m whose :func:`plan_one_run_audit` bound (score-level audit) reaches the target.

    With delta > 0 the 2 m delta term eventually makes more canaries *hurt*; if the target
    is not reached while 2 m delta <= 1 (or m <= 10^6) a ``ValueError`` says so.
    """
    target = check_epsilon(target_epsilon, "target_epsilon")
    d = check_in_interval("delta", delta, 0.0, 1.0, low_open=False)
    c = check_in_interval("confidence", confidence, 0.0, 1.0)
    strategy = _check_strategy(threshold_strategy)
    cap = _MAX_CANARIES if d == 0.0 else max(4, min(_MAX_CANARIES, int(0.5 / d)))
    low = 4 if isinstance(strategy, (HeldOutSplit, MultiSplit)) else 2
    n = _smallest(lambda m: _one_run_epsilon(m, d, 1.0 - c, strategy, None)[0] >= target, low, cap)
    if n is None:
        raise ValueError(
            f"`target_epsilon` = {target:g} is not reachable by a one-run audit with up to {cap} "
            f"canaries at delta = {d:g} and confidence {c:g}."
        )
    return n
