"""The incremental per-step engine against the from-scratch computation, step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.last_iterate.incremental import IncrementalHeuristic
from opacus_lastiterate.analysis.run import DPSGDRun

# Root finding stops at |dy| <= 1e-14 (1 + |y|) on either path; warm and cold starts land on
# different sides of the root, so eps agrees to a few 1e-12 relative (measured: < 1e-12).
REL = 1e-10


def _steps(seed: int, n: int) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    out = []
    sigma, q = 1.0, 0.05
    for _ in range(n):
        if rng.random() < 0.05:  # a noise schedule or a new sample rate now and then
            sigma = float(rng.choice([0.6, 0.9, 1.3, 2.0]))
        if rng.random() < 0.03:
            q = float(rng.choice([0.01, 0.05, 0.2]))
        out.append((sigma, q))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_every_step_equals_the_from_scratch_value(seed: int, delta: float) -> None:
    engine = IncrementalHeuristic()
    history: list[tuple[float, float, int]] = []
    for sigma, q in _steps(seed, 300):
        engine.append(sigma, q)
        if history and history[-1][:2] == (sigma, q):
            history[-1] = (sigma, q, history[-1][2] + 1)
        else:
            history.append((sigma, q, 1))
        scratch = LastIterateHeuristic(DPSGDRun.from_history(history)).epsilon(delta)
        assert engine.epsilon(delta) == pytest.approx(scratch, rel=REL, abs=1e-12)
    assert engine.run.as_history() == history
    assert engine.num_steps == 300


def test_constant_run_to_large_T_matches_from_scratch() -> None:
    engine = IncrementalHeuristic()
    engine.append(1.0, 0.01, 99_000)
    engine.epsilon(1e-6)  # a cold start far from the next steps' thresholds
    for _ in range(1000):
        engine.append(1.0, 0.01)
        engine.epsilon(1e-6)
    scratch = LastIterateHeuristic([(1.0, 0.01, 100_000)]).epsilon(1e-6)
    assert engine.epsilon(1e-6) == pytest.approx(scratch, rel=REL)


def test_delta_and_empty_and_noiseless_runs() -> None:
    engine = IncrementalHeuristic()
    assert engine.epsilon(1e-5) == 0.0 and engine.delta(1.0) == 0.0
    engine.append(0.0, 0.1, 4)
    assert engine.noiseless and engine.epsilon(1e-5) == math.inf and engine.delta(3.0) == 1.0
    engine.append(1.5, 0.1, 10)  # noise from later steps is not credited to a noiseless one
    assert engine.epsilon(1e-5) == math.inf and engine.delta(1.0) == 1.0
    assert LastIterateHeuristic([(0.0, 0.1, 4), (1.5, 0.1, 10)]).epsilon(1e-5) == math.inf


def test_suffix_peak_tracks_the_largest_value_of_a_single_segment() -> None:
    engine = IncrementalHeuristic()
    values = []
    for _ in range(40):
        engine.append(0.5, 0.05)
        values.append(engine.epsilon(1e-6))
    peak = engine.suffix_peak(1e-6)
    assert peak is not None
    assert peak.epsilon == max(values) and peak.steps == int(np.argmax(values)) + 1
    engine.append(2.0, 0.05)  # a new segment: suffixes of the old one no longer apply
    assert engine.suffix_peak(1e-6) is None


def test_warm_starts_where_the_loss_slope_underflows() -> None:
    # q = 0.001: around T = 1674 the extrapolated threshold lay so far left that the slope
    # of the privacy loss underflowed to 0 (a ZeroDivisionError before the fix)
    engine = IncrementalHeuristic()
    for t in range(1, 2001):
        engine.append(1.0, 0.001)
        eps = engine.epsilon(1e-5)
        if t % 400 == 0 or 1670 <= t <= 1680:
            scratch = LastIterateHeuristic([(1.0, 0.001, t)]).epsilon(1e-5)
            assert eps == pytest.approx(scratch, rel=REL)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_fuzz_long_constant_runs_never_fail_and_match(seed: int) -> None:
    """Random (q, sigma, delta), every step asked: no exception, and the sampled steps equal
    the from-scratch value (the warm path is only a faster route to the same root)."""
    rng = np.random.default_rng(1000 + seed)
    q = float(10 ** rng.uniform(-4, -0.3))
    sigma = float(10 ** rng.uniform(-0.5, 0.7))
    delta = float(10 ** rng.uniform(-10, -3))
    steps = int(rng.integers(500, 6000))
    engine = IncrementalHeuristic()
    checks = set(np.unique(np.geomspace(1, steps, 15).astype(int)).tolist())
    for t in range(1, steps + 1):
        engine.append(sigma, q)
        eps = engine.epsilon(delta)
        if t in checks:
            scratch = LastIterateHeuristic([(sigma, q, t)]).epsilon(delta)
            assert eps == pytest.approx(scratch, rel=REL, abs=1e-12), (q, sigma, delta, t)


def _step_by_step(engine: IncrementalHeuristic, sigma: float, q: float, n: int, delta: float):
    out = []
    for _ in range(n):
        engine.append(sigma, q)
        out.append(engine.epsilon(delta))
    return np.array(out)


@pytest.mark.parametrize(
    "sigma,q,start,delta",
    [(1.0, 64 / 1437, 0, 1e-5), (0.6, 0.01, 0, 1e-6), (2.0, 0.2, 0, 1e-5),
     (0.5, 0.5, 0, 1e-3), (1.0, 0.001, 50_000, 1e-5), (1.0, 0.05, 3_000, 1e-9)],
)  # fmt: skip
@pytest.mark.parametrize("batch", [1, 7, 100])
def test_advance_equals_step_by_step(sigma, q, start, delta, batch):
    """Batches of steps solved together give the step-by-step values (to the root finder's
    tolerance), the same suffix peak, and leave the engine where step-by-step calls leave
    it: later steps, one by one, still agree."""
    one, many = IncrementalHeuristic(), IncrementalHeuristic()
    if start:
        one.append(sigma, q, start)
        many.append(sigma, q, start)
    want = _step_by_step(one, sigma, q, 300, delta)
    got = np.concatenate([many.advance(sigma, q, batch, delta) for _ in range(300 // batch)])
    got = np.concatenate([got, many.advance(sigma, q, 300 - got.size, delta)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert many.num_steps == one.num_steps and many.run.as_history() == one.run.as_history()
    assert many.suffix_peak(delta).steps == one.suffix_peak(delta).steps
    assert many.epsilon(delta) == got[-1]  # cached, as after a step-by-step query
    np.testing.assert_allclose(
        _step_by_step(many, sigma, q, 20, delta), _step_by_step(one, sigma, q, 20, delta),
        rtol=1e-12,
    )  # fmt: skip


def test_advance_outside_the_stacked_path_still_answers():
    """Several sample rates, a noise change, zero noise and q = 1 go step by step."""
    engine, reference = IncrementalHeuristic(), IncrementalHeuristic()
    for sigma, q, n in [(1.0, 0.05, 30), (1.0, 0.02, 40), (1.5, 0.02, 30), (1.0, 1.0, 5)]:
        got = engine.advance(sigma, q, n, 1e-5)
        np.testing.assert_allclose(got, _step_by_step(reference, sigma, q, n, 1e-5), rtol=1e-12)
    assert engine.run.as_history() == reference.run.as_history()
    noiseless = IncrementalHeuristic()
    assert math.isinf(noiseless.advance(0.0, 0.05, 3, 1e-5)[-1])
    assert noiseless.advance(1.0, 0.05, 3, 1e-5).tolist() == [math.inf] * 3


def test_advance_on_a_new_noise_level_of_the_same_rate_stacks_and_agrees():
    """Same q, new sigma: the count is still one binomial; the variance changes per step."""
    engine, reference = IncrementalHeuristic(), IncrementalHeuristic()
    engine.advance(1.0, 0.05, 50, 1e-5)
    _step_by_step(reference, 1.0, 0.05, 50, 1e-5)
    got = engine.advance(1.7, 0.05, 60, 1e-5)
    np.testing.assert_allclose(got, _step_by_step(reference, 1.7, 0.05, 60, 1e-5), rtol=1e-12)
    assert engine.suffix_peak(1e-5) is None and reference.suffix_peak(1e-5) is None


@pytest.mark.parametrize("gamma", [0.999, 1.003])
def test_advance_with_a_noise_multiplier_per_step_stacks_and_agrees(gamma):
    """One sigma per step (a noise scheduler): the stacked solve gives the values of
    append + epsilon step by step, and the same run-length history."""
    sigmas = 1.1 * gamma ** np.arange(400)
    engine, reference = IncrementalHeuristic(), IncrementalHeuristic()
    got = np.concatenate([engine.advance(sigmas[k:k + 100], 0.02, 100, 1e-5)
                          for k in range(0, 400, 100)])  # fmt: skip
    want = []
    for sigma in sigmas:
        reference.append(float(sigma), 0.02)
        want.append(reference.epsilon(1e-5))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert engine.run.as_history() == reference.run.as_history()
    assert len(engine.run.as_history()) == 400


def test_a_sample_rate_that_changes_at_every_step_matches_from_scratch():
    """A rate schedule (a new q at every step, then an old rate back): each left-behind
    rate is convolved into the frozen count once, and the values are those of the run
    computed from scratch."""
    rates = [0.01 * (1 + t / 300) for t in range(300)]
    rates += [rates[60], rates[61], 0.0135, 0.0135]  # old rates back, then a new one
    engine, history = IncrementalHeuristic(), []
    for t, q in enumerate(rates):
        engine.append(1.0, q)
        history.append((1.0, q, 1))
        if t % 60 == 59 or t >= 300:
            scratch = LastIterateHeuristic(DPSGDRun.from_history(history)).epsilon(1e-5)
            assert engine.epsilon(1e-5) == pytest.approx(scratch, rel=1e-9)
