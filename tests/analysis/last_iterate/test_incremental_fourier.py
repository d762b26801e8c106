"""The characteristic function kept step by step (incremental_fourier) against independent
answers: the from-scratch route's certified brackets at many steps and query patterns, the
enumeration of every inclusion pattern, and the characteristic function of the exact weights
(its stated error bound must hold at every frequency)."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate import incremental_fourier
from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.incremental_fourier import (
    IncrementalCharacteristic,
)
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    cosine_schedule,
    sgd_weights,
    step_schedule,
)

ACC = 1e-3

CASES = {
    "momentum-cosine": (lambda n: cosine_schedule(0.5, n), 0.9, 0.0, False),
    "nesterov-cosine": (lambda n: cosine_schedule(0.2, n), 0.9, 0.0, True),
    "dampening": (lambda n: cosine_schedule(0.3, n), 0.8, 0.3, False),
    "plain-step": (lambda n: step_schedule(0.4, n, step_size=40, gamma=0.5), 0.0, 0.0, False),
    "warmup": (lambda n: np.minimum(1.0, np.arange(1, n + 1) / 60.0) * 0.3, 0.95, 0.0, False),
}


def _scratch(lrs, q, sigma, t, beta, damp, nest, delta):
    """The bracket of a new instance asked once, at step t (from scratch: every step frozen at
    its weight then)."""
    got = IncrementalCharacteristic(beta, damp, nest).solve(
        delta, [float(x) for x in lrs[:t]], [float(x) for x in sigma[:t]],
        [float(x) for x in q[:t]], ACC,
    )  # fmt: skip
    return None if got is None else SimpleNamespace(value=got[0], lower_bound=got[1])


def _run(name, n, queried, q=None, sigma=None, delta=1e-5):
    sched, beta, damp, nest = CASES[name]
    lrs = sched(n)
    q = np.full(n, 0.045) if q is None else q
    sigma = np.full(n, 2.0) if sigma is None else sigma
    inc = IncrementalCharacteristic(beta, damp, nest)
    eta, ss, qq, got = [], [], [], {}
    for t in range(1, n + 1):
        eta.append(float(lrs[t - 1]))
        ss.append(float(sigma[t - 1]))
        qq.append(float(q[t - 1]))
        if queried(t):
            got[t] = inc.solve(delta, eta, ss, qq, ACC)
    return inc, lrs, q, sigma, got


def _check(got, ref):
    assert got is not None and ref is not None
    upper, lower, _ = got
    assert lower <= upper
    assert (upper - lower) / upper <= ACC
    # both brackets hold the exact value: they overlap
    assert upper >= ref.lower_bound * (1 - 1e-12)
    assert lower <= ref.value * (1 + 1e-12)
    # and the kept route is nearly as tight as the one from scratch: freezing adds about
    # FREEZE_ERROR x delta to the error bound, a few times that relative to epsilon
    assert upper <= ref.value * (1 + 10 * incremental_fourier.FREEZE_ERROR)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_step_against_from_scratch(name):
    n = 400
    inc, lrs, q, sigma, got = _run(name, n, lambda t: True)
    _, beta, damp, nest = CASES[name]
    for t in (1, 2, 3, 17, 60, 150, 233, 301, 399, 400):
        _check(got[t], _scratch(lrs, q, sigma, t, beta, damp, nest, 1e-5))
    assert inc.frozen > n - 250  # old steps were frozen (beta = 0.95: about 210 active) ...
    assert inc.rebuilds < 25  # ... and the grid rebuilt a few times only


@pytest.mark.parametrize(
    "pattern",
    [lambda t: t > 500, lambda t: t % 10 == 0, lambda t: t % 97 == 0 or t > 560],
    ids=["long-gap", "every-10", "sparse-then-every-step"],
)
def test_query_patterns_against_from_scratch(pattern):
    n = 600
    q = np.where(np.arange(n) % 3 == 0, 0.02, 0.06)
    sigma = np.where(np.arange(n) % 5 == 0, 1.5, 2.5)
    _, lrs, q, sigma, got = _run("momentum-cosine", n, pattern, q=q, sigma=sigma)
    for t in sorted(got)[:: max(1, len(got) // 8)] + [max(got)]:
        _check(got[t], _scratch(lrs, q, sigma, t, 0.9, 0.0, False, 1e-5))


def _enumerated(w, q, sigma, delta):
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    s = math.sqrt(float(np.sum((w * sigma) ** 2)))
    with np.errstate(divide="ignore"):  # q = 1: patterns of probability 0
        log_p = np.log(probs)
    return ShiftedGaussianMixture(bits @ w, log_p, s).epsilon(delta)


@pytest.mark.parametrize("seed", range(8))
def test_brackets_the_enumerated_value(seed, monkeypatch):
    """Every inclusion pattern of a short momentum run, with freezing forced early (a large
    FREEZE_ERROR, so that the first-order correction and its remainder bound matter)."""
    monkeypatch.setattr(incremental_fourier, "FREEZE_ERROR", 3e-4)
    monkeypatch.setattr(incremental_fourier, "_FREEZE_BLOCK", 1)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(9, 14))
    lrs = rng.uniform(0.05, 0.5, n)
    q = rng.choice([0.05, 0.2, 0.7, 1.0], n)
    sigma = rng.uniform(0.8, 3.0, n)
    beta = float(rng.choice([0.3, 0.5]))
    inc = IncrementalCharacteristic(beta, 0.0, False)
    eta, ss, qq = [], [], []
    for t in range(n):
        eta.append(float(lrs[t]))
        ss.append(float(sigma[t]))
        qq.append(float(q[t]))
        got = inc.solve(1e-3, eta, ss, qq, 0.5)
    assert got is not None
    w = sgd_weights(lrs, momentum=beta)
    exact = _enumerated(w, q, sigma, 1e-3)
    upper, lower, _ = got
    assert inc.frozen > 0
    assert lower * (1 - 1e-9) - 1e-12 <= exact <= upper * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("freeze_error", [1e-5, 1e2])
def test_characteristic_function_within_its_stated_bound(freeze_error, monkeypatch):
    """At every frequency, the kept phi is within its stated bound (freezing remainder and
    rounding) of phi computed directly from the exact weights; with early freezing the
    difference is far above rounding, so the bound is exercised."""
    monkeypatch.setattr(incremental_fourier, "FREEZE_ERROR", freeze_error)
    n = 700
    inc, lrs, q, _, _ = _run("momentum-cosine", n, lambda t: t % 7 == 0 or t > 690)
    theta, phi, s, mu, bound = inc.last
    w = sgd_weights(lrs, momentum=0.9)
    terms = np.log1p(q * (np.exp(1j * np.outer(theta, w)) - 1.0)).sum(axis=1)
    exact = np.exp(terms - 1j * theta * mu - 0.5 * (s * theta) ** 2)
    diff = np.abs(phi - exact)
    slack = 1e-13 * np.abs(exact) + 1e-300  # the direct product's own rounding
    assert np.all(diff <= bound + slack)
    if freeze_error > 1.0:
        assert np.max(diff / np.abs(exact)) > 1e-10  # the remainder is visible


def test_engine_answers_every_step_from_the_kept_function():
    """The weighted engine's epsilon (every step after a gap) comes from the kept function:
    its grid is built once or a few times, and the answers bracket the from-scratch ones."""
    n = 500
    lrs = cosine_schedule(0.5, n)
    eng = IncrementalWeightedHeuristic(ACC)
    for t in range(1, n + 1):
        eng.append(2.0, 0.045, float(lrs[t - 1]), 0.9)
        if t > 450:
            r = eng.epsilon(1e-5)
    ref = _scratch(lrs, np.full(n, 0.045), np.full(n, 2.0), n, 0.9, 0.0, False, 1e-5)
    _check((r.value, r.lower_bound, 0), ref)
    state = eng.characteristic_state()
    assert state is not None and state["n"] == n and state["rebuilds"] <= 3


def test_another_delta_is_answered_from_scratch():
    """A delta other than the grid's that the grid cannot certify returns None (the engine
    then answers from scratch); the grid's delta keeps being answered."""
    inc, *_ = _run("momentum-cosine", 200, lambda t: t == 200)
    eta = list(cosine_schedule(0.5, 200))
    s, q = [2.0] * 200, [0.045] * 200
    assert inc.solve(1e-12, eta, s, q, ACC) is None
    assert inc.solve(1e-5, eta, s, q, ACC) is not None


def test_extend_is_append_step_by_step():
    """extend() (a run of steps at once, as the accountant replays its trace) leaves the
    engine as appending them one by one does: the same answers, bit for bit."""
    n = 300
    lrs = cosine_schedule(0.3, n)
    one, many = IncrementalWeightedHeuristic(ACC), IncrementalWeightedHeuristic(ACC)
    for t in range(n):
        one.append(1.5, 0.03, float(lrs[t]), 0.9, 0.1, False, 0.0)
    many.append(1.5, 0.03, float(lrs[0]), 0.9, 0.1, False, 0.0)
    rest = n - 1
    many.extend(np.full(rest, 1.5), np.full(rest, 0.03), lrs[1:], np.full(rest, 0.9),
                np.full(rest, 0.1), np.zeros(rest, bool), np.zeros(rest))  # fmt: skip
    assert one.epsilon(1e-5) == many.epsilon(1e-5)
    # a step outside the incremental scope (weight decay) is noticed as by append
    many.extend(np.ones(1), np.full(1, 0.03), lrs[:1], np.full(1, 0.9), np.full(1, 0.1),
                np.zeros(1, bool), np.full(1, 1e-4))  # fmt: skip
    assert not many.supported


@pytest.mark.slow
def test_kept_route_answers_every_step_of_a_long_run():
    """Asked at every one of 10^5 steps (momentum 0.9, cosine, sigma 6: epsilon about 9.5 at
    the end), the kept characteristic function certifies every query itself (none declined to
    the from-scratch route) and changes grids by the shadow, not by rebuilds, after the first
    few hundred steps; the last answer brackets the from-scratch value."""
    n = 100_000
    lrs = cosine_schedule(0.5, n)
    inc = IncrementalCharacteristic(0.9, 0.0, False)
    eta, ss, qq = [], [], []
    declined = []
    for t in range(n):
        eta.append(float(lrs[t]))
        ss.append(6.0)
        qq.append(0.0445)
        got = inc.solve(1e-5, eta, ss, qq, ACC)
        if got is None:
            declined.append(t)
    assert not declined, f"{len(declined)} queries declined, the first at step {declined[0]}"
    early = inc.rebuilds
    assert inc.switches >= 10 and early <= 15
    _check(got, _scratch(lrs, np.full(n, 0.0445), np.full(n, 6.0), n, 0.9, 0.0, False, 1e-5))


@pytest.mark.parametrize("name", ["momentum-cosine", "nesterov-cosine", "dampening", "plain-step"])
def test_a_grid_built_in_blocks_brackets_the_same_value(name, monkeypatch):
    """A new grid takes in the frozen steps a block at a time (and the Chernoff sums run over
    blocks), so that a long run's first query needs O(block) temporaries: with blocks of 37
    and 50 steps its bracket still holds the from-scratch value, and its upper end lies within
    1e-9 relative of the one built in one block (the grid's interval moves by rounding)."""
    from opacus_lastiterate.analysis.last_iterate import weighted_fourier

    n = 700
    queried = lambda t: t in (300, 650, 700)  # noqa: E731 (a gap: frozen steps to refold)
    *_, whole = _run(name, n, queried)
    monkeypatch.setattr(incremental_fourier, "_BUILD_BLOCK", 37)
    monkeypatch.setattr(weighted_fourier, "_BLOCK", 50)
    inc, lrs, q, sigma, blocked = _run(name, n, queried)
    assert inc.rebuilds >= 1
    _, beta, damp, nest = CASES[name]
    for t in (300, 650, 700):
        _check(blocked[t], _scratch(lrs, q, sigma, t, beta, damp, nest, 1e-5))
        assert blocked[t][0] == pytest.approx(whole[t][0], rel=1e-9)
