"""f-DP one-run analysis (Mahloujifar, Melis, Chaudhuri 2024, arXiv:2410.22235).

Reference values: jax_privacy 2.0.0's own implementation on the inputs of its own test
(``data/README.md``). Validity: coverage simulations (the slow tests) on a Gaussian mechanism
(both families cover) and on randomised response with a revealing delta (only the
(eps, delta) family covers; the Gaussian family is labelled an estimate for that reason).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit import (
    Bonferroni,
    ScoreAudit,
    one_run_epsilon_bound,
    one_run_fdp_bound,
)
from opacus_lastiterate.analysis.audit.one_run_fdp import g_function, rejects
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.exceptions import NonRandomizedInclusionWarning


def one_run_fdp_rejects(m, r, v, *, family, parameter, delta=0.0, confidence=0.95) -> bool:
    """The f-DP one-run test that ``one_run_fdp_bound`` inverts (``rejects`` of the claim's
    trade-off function), called as the tests read it."""
    return rejects(m, r, v, 1.0 - confidence, g_function(family, parameter, delta))


VECTORS = json.loads(
    (Path(__file__).parent / "data" / "jax_privacy_one_run_vectors.json").read_text()
)
REL = 1e-5  # jax_privacy root-finds with xtol = 1e-6; ours is bisection to 1e-10


def deterministic_normal(mu: float, n: int) -> np.ndarray:
    return stats.norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mu


@pytest.mark.parametrize(
    "case", VECTORS["count_vectors"], ids=lambda c: f"{c['m']}-{c['r']}-{c['v']}"
)
def test_counts_match_jax_privacy(case) -> None:
    res = one_run_fdp_bound(
        case["m"],
        case["r"],
        case["v"],
        delta=case["delta"],
        confidence=1 - case["significance"],
        family="gaussian",
    )
    assert res.epsilon == pytest.approx(case["epsilon_one_run_fdp"], rel=REL)
    assert res.kind == "estimate" and res.mu is not None
    assert res.epsilon == pytest.approx(gaussian_epsilon(mu=res.mu, delta=case["delta"]), rel=1e-12)


@pytest.mark.parametrize("row", VECTORS["score_vectors"], ids=lambda r: f"shift{r['shift']}")
def test_scores_match_jax_privacy_with_its_threshold_set(row) -> None:
    """jax_privacy's Bonferroni divides by its own threshold count (ending with +inf): passed
    as explicit candidates, both one-run analyses reproduce its numbers."""
    audit = ScoreAudit(
        deterministic_normal(row["shift"], row["n"]), deterministic_normal(0, row["n"])
    )
    thresholds = [float(t) for t in row["thresholds"]]
    assert thresholds[-1] == math.inf
    kw = {
        "delta": row["delta"],
        "confidence": 1 - row["significance"],
        "threshold_strategy": Bonferroni(candidates=thresholds),
    }
    fdp = audit.one_run_fdp(family="gaussian", **kw)
    assert fdp.epsilon == pytest.approx(row["epsilon_one_run_fdp"], rel=REL, abs=1e-12)
    assert audit.one_run(**kw).epsilon == pytest.approx(row["epsilon_one_run"], rel=REL, abs=1e-12)
    assert audit.auroc(convex_hull=True) == pytest.approx(row["attack_auroc"], rel=1e-12)
    fprs = [float(f) for f in row["tpr_at_fpr"]]
    np.testing.assert_allclose(audit.tpr_at_fpr(fprs), list(row["tpr_at_fpr"].values()), rtol=1e-12)
    # The assumption-free family lies between the Steinke et al. bound and the Gaussian estimate.
    eps_delta = audit.one_run_fdp(**kw)
    assert eps_delta.kind == "bound"
    if row["shift"] > 0:
        assert row["epsilon_one_run"] < eps_delta.epsilon < fdp.epsilon


def test_rejection_is_monotone_and_bound_is_the_crossing() -> None:
    m, r, v, delta = 1000, 200, 180, 1e-5
    for family in ("gaussian", "epsilon-delta"):
        res = one_run_fdp_bound(m, r, v, delta=delta, family=family)
        p = res.mu if family == "gaussian" else res.epsilon
        assert p is not None and p > 0
        grid = np.linspace(0, 3 * p, 61)
        rej = [one_run_fdp_rejects(m, r, v, family=family, parameter=x, delta=delta) for x in grid]
        assert rej == sorted(rej, reverse=True)  # True, ..., True, False, ...
        assert one_run_fdp_rejects(m, r, v, family=family, parameter=p, delta=delta)
        assert not one_run_fdp_rejects(
            m, r, v, family=family, parameter=p * (1 + 1e-8), delta=delta
        )


def test_edge_cases_and_labels() -> None:
    assert one_run_fdp_bound(100, 0, 0, delta=1e-5).epsilon == 0.0
    assert one_run_fdp_bound(100, 50, 0, delta=1e-5).epsilon == 0.0
    assert one_run_fdp_bound(100, 50, 25, delta=1e-5).epsilon == 0.0  # chance level
    # delta = 0 is allowed for the (eps, delta) family, and more guesses right never hurt.
    vals = [one_run_fdp_bound(1000, 100, v, delta=0.0).epsilon for v in (80, 90, 100)]
    assert vals == sorted(vals) and vals[0] > 0
    with pytest.raises(ValueError, match="`delta` must be in"):
        one_run_fdp_bound(100, 10, 10, delta=0.0, family="gaussian")
    with pytest.raises(ValueError, match="`family` must be one of"):
        one_run_fdp_bound(100, 10, 10, delta=1e-5, family="laplace")  # type: ignore[arg-type]
    with pytest.warns(NonRandomizedInclusionWarning):
        res = one_run_fdp_bound(100, 10, 10, delta=1e-5, inclusion_randomized=False)
    assert res.kind == "invalid" and str(res).startswith("NOT A VALID BOUND")
    ok = one_run_fdp_bound(100, 10, 10, delta=1e-5)
    assert ok.kind == "bound" and str(ok).startswith("epsilon >=") and "lower bound" in str(ok)
    gauss = one_run_fdp_bound(100, 10, 10, delta=1e-5, family="gaussian")
    assert str(gauss).startswith("NOT A VALID BOUND (estimate")


def test_epsilon_delta_family_never_exceeds_the_saturation_of_a_perfect_guesser() -> None:
    """With v = r all right and delta = 0 no analysis can exceed the likelihood-ratio limit
    ln(a^(1/r) / (1 - a^(1/r))) of the Steinke et al. bound by much: same game, same data."""
    for r in (10, 100, 1000):
        fdp = one_run_fdp_bound(10 * r, r, r, delta=0.0).epsilon
        steinke = one_run_epsilon_bound(10 * r, r, r, delta=0.0).epsilon
        assert fdp == pytest.approx(steinke, rel=0.05)


# ---------------------------------------------------------------------------------------
# Coverage (slow).
# ---------------------------------------------------------------------------------------

NOMINAL = 0.05


def slack_count(reps: int, rate: float, tail: float = 1e-3) -> int:
    """Largest count a procedure failing at exactly ``rate`` exceeds with probability < ``tail``."""
    return int(stats.binom.ppf(1 - tail, reps, rate))


def gaussian_true_epsilon(mu: float, delta: float) -> float:
    return gaussian_epsilon(mu=mu, delta=delta)


@pytest.mark.slow
def test_coverage_gaussian_mechanism() -> None:
    """m canaries, score = mu * coin + N(0, 1): each canary is exactly mu-GDP. Neither family
    may exceed the truth (eps of mu-GDP at delta; mu itself) more often than 5%."""
    m, mu, delta, reps = 10000, 0.5, 1e-6, 200
    eps_true = gaussian_true_epsilon(mu, delta)
    rng = np.random.default_rng(20251)
    fail_eps_delta = fail_gauss = 0
    best = 0.0
    for _ in range(reps):
        coins = rng.random(m) < 0.5
        audit = ScoreAudit.from_canaries(mu * coins + rng.standard_normal(m), coins)
        a = audit.one_run_fdp(delta=delta)
        g = audit.one_run_fdp(delta=delta, family="gaussian")
        fail_eps_delta += a.epsilon > eps_true
        fail_gauss += g.mu > mu  # type: ignore[operator]
        best = max(best, a.epsilon)
    print(
        f"gaussian mechanism: eps_true {eps_true:.3f}, failures (eps,delta) {fail_eps_delta}/{reps}, "
        f"gaussian {fail_gauss}/{reps}, largest bound {best:.3f}"
    )
    assert fail_eps_delta <= slack_count(reps, NOMINAL)
    assert fail_gauss <= slack_count(reps, NOMINAL)


def randomized_response_scores(
    coins: np.ndarray, eps0: float, delta: float, rng: np.random.Generator
) -> np.ndarray:
    """(eps0, delta)-DP per canary, tight: with probability delta the coin is revealed
    (score +-2), otherwise randomised response (score 1 = "reported in")."""
    m = coins.size
    p = math.exp(eps0) / (1 + math.exp(eps0))
    reported = np.where(rng.random(m) < p, coins, ~coins)
    reveal = rng.random(m) < delta
    return np.where(reveal, np.where(coins, 2.0, -2.0), reported.astype(float))


@pytest.mark.slow
def test_coverage_randomized_response() -> None:
    """Randomised response with eps0 = 1 and a revealing delta = 1e-4: (eps0, delta)-DP and
    no better, so its true epsilon at delta is eps0. Both assumption-free analyses cover."""
    m, eps0, delta, reps = 4000, 1.0, 1e-4, 200
    rng = np.random.default_rng(20252)
    fail_eps_delta = fail_steinke = 0
    for _ in range(reps):
        coins = rng.random(m) < 0.5
        audit = ScoreAudit.from_canaries(randomized_response_scores(coins, eps0, delta, rng), coins)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fail_eps_delta += audit.one_run_fdp(delta=delta).epsilon > eps0
            fail_steinke += audit.one_run(delta=delta).epsilon > eps0
    print(
        f"randomised response: failures (eps,delta) f-DP {fail_eps_delta}/{reps}, Steinke {fail_steinke}/{reps}"
    )
    assert fail_eps_delta <= slack_count(reps, NOMINAL)
    assert fail_steinke <= slack_count(reps, NOMINAL)


@pytest.mark.slow
def test_gaussian_family_overshoots_a_non_gaussian_mechanism() -> None:
    """A mechanism that reveals each canary's coin with probability 0.05 and nothing
    otherwise is (0, 0.05)-DP: its true epsilon at delta = 0.05 is 0. The Gaussian family's
    epsilon exceeds 0 almost always (why it is labelled an estimate); the (eps, delta)
    family stays at 0 at the nominal rate."""
    m, delta, reps = 2000, 0.05, 100
    rng = np.random.default_rng(20253)
    fail_eps_delta = fail_gauss = 0
    for _ in range(reps):
        coins = rng.random(m) < 0.5
        audit = ScoreAudit.from_canaries(randomized_response_scores(coins, 0.0, delta, rng), coins)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fail_eps_delta += audit.one_run_fdp(delta=delta).epsilon > 0
        fail_gauss += audit.one_run_fdp(delta=delta, family="gaussian").epsilon > 0
    print(
        f"reveal-with-probability-delta: failures (eps,delta) f-DP {fail_eps_delta}/{reps}, gaussian {fail_gauss}/{reps}"
    )
    assert fail_eps_delta <= slack_count(reps, NOMINAL)
    assert fail_gauss > reps // 2
