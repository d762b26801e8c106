"""Incremental weighted heuristic: step-by-step brackets against the from-scratch solve and
an exact 2^T enumeration, rebuilds, and the fallback for traces outside its scope."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.gaussian_mixture import ShiftedGaussianMixture
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    cosine_schedule,
    sgd_weights,
    step_schedule,
)
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
    weighted_heuristic_epsilon_result,
)

ACC = 1e-3
FAST = 1e-2  # accuracy of the default (fast) comparisons; the slow sweep uses ACC


def _run(lrs, q, sigma, *, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
         delta=1e-5, check=None, accuracy=ACC, fourier=False):  # fmt: skip
    """Feed the steps one by one; keep the results at the steps listed in ``check``. The grid
    route, asked after every step, unless ``fourier``: then asked only at the ``check`` steps
    (every step when None), as a monitor asks it."""
    n = len(lrs)
    q = np.broadcast_to(np.asarray(q, float), (n,))
    sigma = np.broadcast_to(np.asarray(sigma, float), (n,))
    inc = IncrementalWeightedHeuristic(accuracy, fourier=fourier)
    out = {}
    for t in range(n):
        inc.append(float(sigma[t]), float(q[t]), float(lrs[t]), momentum, dampening, nesterov,
                   weight_decay)  # fmt: skip
        if check is None or t + 1 in check:
            out[t + 1] = inc.epsilon(delta)
        elif not fourier:
            inc.epsilon(delta)
    return inc, out


def _scratch(lrs, q, sigma, t, delta=1e-5, accuracy=ACC, **opt):
    w = sgd_weights(np.asarray(lrs[:t], float), **opt)
    n = w.size
    qq = np.broadcast_to(np.asarray(q, float), (len(lrs),))[:n]
    ss = np.broadcast_to(np.asarray(sigma, float), (len(lrs),))[:n]
    return weighted_heuristic_epsilon_result(
        delta, weights=w, sample_rates=qq, noise_multipliers=ss, accuracy=accuracy
    )


def _bracketed(r, ref, accuracy=FAST):
    assert r.lower_bound <= r.value
    assert r.relative_accuracy <= accuracy
    # the exact value lies in both brackets, so they must overlap
    assert r.value >= ref.lower_bound * (1 - 1e-12)
    assert r.lower_bound <= ref.value * (1 + 1e-12)


CASES = {
    "momentum-cosine": (lambda n: cosine_schedule(0.1, n), {"momentum": 0.9}),
    "nesterov-cosine": (lambda n: cosine_schedule(0.05, n), {"momentum": 0.9, "nesterov": True}),
    "dampening": (lambda n: cosine_schedule(0.1, n), {"momentum": 0.8, "dampening": 0.3}),
    "plain-step": (lambda n: step_schedule(0.4, n, step_size=40, gamma=0.5), {}),
}


ROUTES = pytest.mark.parametrize("fourier", [False, True], ids=["grid", "fourier"])


def _check_route(inc, fourier):
    """The Fourier route answered every query (no grid kept) when asked for."""
    if fourier:
        assert inc._fourier and inc._state is None


@ROUTES
@pytest.mark.parametrize("name", sorted(CASES))
def test_step_by_step_against_from_scratch(name, fourier):
    sched, opt = CASES[name]
    n = 160
    lrs = sched(n)
    steps = {1, 2, 7, 30, 100, 131, 160}
    inc, got = _run(lrs, 0.02, 1.0, check=steps, accuracy=FAST, fourier=fourier, **opt)
    _check_route(inc, fourier)
    for t in sorted(steps):
        _bracketed(got[t], _scratch(lrs, 0.02, 1.0, t, accuracy=FAST, **opt))


@ROUTES
def test_varying_sample_rate_and_noise(fourier):
    n = 150
    lrs = cosine_schedule(0.1, n)
    rng = np.random.default_rng(3)
    q = rng.choice([0.01, 0.05], n)
    sigma = rng.choice([0.8, 1.5], n)
    steps = {5, 60, 150}
    inc, got = _run(lrs, q, sigma, momentum=0.9, check=steps, accuracy=FAST, fourier=fourier)
    _check_route(inc, fourier)
    for t in sorted(steps):
        _bracketed(got[t], _scratch(lrs, q, sigma, t, momentum=0.9, accuracy=FAST))


def _exact(weights, q, sigma, delta):
    w = np.asarray(weights, float)
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    s = math.sqrt(float(np.sum((w * sigma) ** 2)))
    return ShiftedGaussianMixture(bits @ w, np.log(probs), s).epsilon(delta)


@ROUTES
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_enumeration_up_to_14_steps(seed, fourier):
    rng = np.random.default_rng(seed)
    n = 14
    lrs = rng.uniform(0.02, 0.2, n)
    q = float(rng.choice([0.1, 0.3, 0.6]))
    opt = [{"momentum": 0.9}, {"momentum": 0.5, "nesterov": True}, {"momentum": 0.7,
           "dampening": 0.5}][seed]  # fmt: skip
    inc, got = _run(lrs, q, 1.0, delta=1e-4, fourier=fourier, **opt)
    _check_route(inc, fourier)
    for t in (1, 3, 8, 14):
        exact = _exact(sgd_weights(lrs[:t], **opt), q, 1.0, 1e-4)
        r = got[t]
        assert r.lower_bound * (1 - 1e-9) <= exact <= r.value * (1 + 1e-9)
        assert r.relative_accuracy <= ACC


def test_frozen_steps_are_used_and_stay_bracketed():
    n = 400
    lrs = cosine_schedule(0.1, n)
    inc, got = _run(lrs, 0.01, 1.0, momentum=0.9, check={400}, accuracy=FAST)
    state = inc._state
    assert state is not None and state.frozen > 200  # most steps are frozen
    _bracketed(got[400], _scratch(lrs, 0.01, 1.0, 400, momentum=0.9, accuracy=FAST))


def test_warmup_rebuilds_and_stays_correct():
    n = 260
    lrs = np.r_[np.linspace(0.005, 0.1, 60), cosine_schedule(0.1, n - 60)]
    steps = {30, 61, 200, 260}
    inc, got = _run(lrs, 0.02, 1.0, momentum=0.9, check=steps, accuracy=FAST)
    assert inc.rebuilds >= 3  # the rate rose above eta_bar several times
    for t in sorted(steps):
        _bracketed(got[t], _scratch(lrs, 0.02, 1.0, t, momentum=0.9, accuracy=FAST))


def test_late_rate_jump_rebuilds():
    lrs = np.r_[np.full(130, 0.01), np.full(20, 0.1)]  # 10x above eta_bar after freezing
    inc, got = _run(lrs, 0.02, 1.0, momentum=0.9, check={129, 131, 150}, accuracy=FAST)
    assert inc.rebuilds >= 2
    for t in (129, 131, 150):
        _bracketed(got[t], _scratch(lrs, 0.02, 1.0, t, momentum=0.9, accuracy=FAST))


@pytest.mark.parametrize(
    "kw",
    [
        {"weight_decay": 0.01, "momentum": 0.9},
        {"momentum": "cycle"},
    ],
)
def test_fallback_equals_from_scratch(kw):
    n = 40
    lrs = cosine_schedule(0.1, n)
    inc = IncrementalWeightedHeuristic(fourier=False)
    moms = np.linspace(0.95, 0.85, n) if kw.get("momentum") == "cycle" else np.full(n, 0.9)
    wd = kw.get("weight_decay", 0.0)
    for t in range(n):
        inc.append(1.0, 0.05, float(lrs[t]), float(moms[t]), 0.0, False, wd)
    assert not inc.supported
    got = inc.epsilon(1e-5)
    w = sgd_weights(lrs, momentum=moms, weight_decay=wd)
    ref = weighted_heuristic_epsilon_result(1e-5, weights=w, sample_rates=0.05, noise_multipliers=1.0)
    assert got.value == ref.value and got.lower_bound == ref.lower_bound


def test_empty_and_delta_query():
    inc = IncrementalWeightedHeuristic(fourier=False)
    assert inc.epsilon(1e-5).value == 0.0
    lrs = cosine_schedule(0.1, 50)
    for t in range(50):
        inc.append(1.0, 0.05, float(lrs[t]), 0.9)
    r = inc.delta(1.0)
    w = sgd_weights(lrs, momentum=0.9)
    from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
        weighted_heuristic_delta_result,
    )

    ref = weighted_heuristic_delta_result(1.0, weights=w, sample_rates=0.05, noise_multipliers=1.0)
    assert r.value >= ref.lower_bound and r.lower_bound <= ref.value


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_long_sweep_against_from_scratch(name):
    sched, opt = CASES[name]
    n = 800
    lrs = sched(n)
    steps = set(range(50, n + 1, 75))
    _, got = _run(lrs, 0.01, 0.9, check=steps, **opt)
    for t in sorted(steps):
        _bracketed(got[t], _scratch(lrs, 0.01, 0.9, t, **opt), ACC)


def test_pmf_fold_in_scratch_arrays_equals_fresh_arrays_and_spares_copies() -> None:
    """GridPmf.fold reuses its scratch arrays: every value is the float of the allocate-per-fold
    formula, and an array handed to a copy (or to a pickle) is never written afterwards."""
    import pickle

    from opacus_lastiterate.analysis.last_iterate.grid_pmf import GridPmf as _Pmf

    rng = np.random.default_rng(7)
    start = rng.random(50)
    pmf, ref = _Pmf(start.copy()), start.copy()
    copies: list[tuple[_Pmf, np.ndarray]] = []
    for i in range(200):
        k, q = int(rng.integers(1, 40)), float(rng.uniform(0.01, 0.5))
        pmf.fold(k, q)
        out = np.empty(ref.size + k)  # the formula with a fresh array per fold
        np.multiply(ref, 1.0 - q, out=out[: ref.size])
        out[ref.size :] = 0.0
        out[k:] += q * ref
        ref = out
        assert np.array_equal(pmf.p, ref)
        if i % 7 == 0:
            c = pmf.copy()
            copies.append((c, c.p.copy()))
        if i % 11 == 0:
            pmf.trim(1e-300)
            ref = pmf.p.copy()
    for c, values in copies:  # the original folded many times since: the copies are intact
        assert np.array_equal(c.p, values)
    data = pickle.dumps(pmf)
    assert len(data) < pmf.p.nbytes + 2_000  # the values, not the scratch arrays
    back = pickle.loads(data)
    assert np.array_equal(back.p, pmf.p) and all(b is None for b in back._scratch)


def test_long_run_asked_every_step_stays_on_the_fourier_route():
    """A query at every step keeps the Fourier route (no grid state built: no switch stall),
    as does a query every 10 steps, and each answer brackets the from-scratch grid value."""
    lrs = cosine_schedule(0.1, 60)
    every, got = _run(lrs, 0.02, 1.0, momentum=0.9, accuracy=FAST, fourier=True)
    assert every._fourier and every._state is None
    for t in (1, 33, 60):
        _bracketed(got[t], _scratch(lrs, 0.02, 1.0, t, accuracy=FAST, momentum=0.9))
    sparse = IncrementalWeightedHeuristic(FAST)
    for t, lr in enumerate(lrs, 1):
        sparse.append(1.0, 0.02, float(lr), 0.9)
        if t % 10 == 0:
            sparse.epsilon(1e-5)
    assert sparse._fourier and sparse._state is None
