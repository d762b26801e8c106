"""Certified max over t of the heuristic epsilon of the last t steps (robust heuristic)."""

from __future__ import annotations

import math
import random

import pytest

from opacus_lastiterate.analysis.last_iterate import suffix_maximum
from opacus_lastiterate.analysis.last_iterate.counterexamples import heuristic_monotonicity
from opacus_lastiterate.analysis.last_iterate.heuristic import RobustLastIterateHeuristic
from opacus_lastiterate.analysis.last_iterate.heuristic_pair import segments_epsilon
from opacus_lastiterate.analysis.last_iterate.suffix_maximum import (
    SuffixMaximum,
    certified_suffix_maximum,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment, suffix

RTOL = 1e-6
ENGINE = 1e-12  # the search builds the same pairs as heuristic._epsilon; allow float noise


def _history(rng: random.Random, max_steps: int) -> tuple[tuple[TrainingSegment, ...], float]:
    """2-4 segments, q in [1e-3, 1] (log-uniform, sometimes exactly 1), sigma in [0.4, 5]."""
    m = rng.randint(2, 4)
    segments = tuple(
        TrainingSegment(
            noise_multiplier=rng.uniform(0.4, 0.8) if rng.random() < 0.5 else rng.uniform(0.4, 5.0),
            sample_rate=1.0 if rng.random() < 0.1 else math.exp(rng.uniform(math.log(1e-3), 0.0)),
            steps=rng.randint(1, max_steps // m),
        )
        for _ in range(m)
    )
    return segments, 10 ** rng.uniform(-8, -3)


def _brute(segments: tuple[TrainingSegment, ...], delta: float) -> list[float]:
    n = sum(s.steps for s in segments)
    return [segments_epsilon(suffix(segments, t), delta) for t in range(1, n + 1)]


def _check_against_brute(segments: tuple[TrainingSegment, ...], delta: float) -> SuffixMaximum:
    values = _brute(segments, delta)
    top = max(values)
    r = certified_suffix_maximum(segments, delta, rtol=RTOL)
    assert r.attained == pytest.approx(values[r.argmax_steps - 1], rel=ENGINE, abs=1e-15)
    assert top / (1 + RTOL) * (1 - ENGINE) <= r.attained <= top * (1 + ENGINE)
    assert top * (1 - ENGINE) <= r.epsilon <= top * (1 + RTOL) + 1e-12
    assert r.epsilon <= r.attained * (1 + RTOL) + 1e-12
    assert 1 <= r.evaluations <= len(values)
    return r


# -- the bug this module fixes ---------------------------------------------------------------


def test_reproducer_peak_at_a_segment_boundary():
    history = [(0.5334702641641362, 0.05, 1000), (2.0, 0.05, 200), (0.6, 0.05, 1503)]
    last = privacy_model("heuristic", DPSGDRun.constant(steps=1503, sample_rate=0.05, noise_multiplier=0.6)).epsilon(1e-6)
    assert round(last, 5) == 22.45498  # the grid search of old gave 22.41965
    robust = RobustLastIterateHeuristic(history).epsilon(1e-6)
    assert robust >= last
    r = certified_suffix_maximum(tuple(TrainingSegment(*h) for h in history), 1e-6)
    assert r.argmax_steps == 1503 and r.attained == pytest.approx(last, rel=ENGINE)
    assert last <= r.epsilon <= r.attained * (1 + RTOL)


# -- the bound (*) itself --------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_interval_bound_dominates_every_interior_value(seed):
    """The proof's pair (count of hi - 1 steps, noise of lo + 1 steps) bounds lo < t < hi."""
    rng = random.Random(seed)
    segments, delta = _history(rng, 240)
    values = _brute(segments, delta)
    search = suffix_maximum._Search(segments, delta)
    later = 0
    for seg in reversed(segments):
        for _ in range(6):
            if seg.steps < 3:
                break
            lo = later + rng.randint(1, seg.steps - 2)
            hi = rng.randint(lo + 2, later + seg.steps)
            assert search.bound(lo, hi) >= max(values[lo : hi - 1])  # t = lo + 1 .. hi - 1
        later += seg.steps


# -- brute force over every t -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_matches_brute_force_small(seed):
    _check_against_brute(*_history(random.Random(100 + seed), 150))


@pytest.mark.parametrize("seed", range(3))
def test_matches_brute_force_without_grid(monkeypatch, seed):
    """Grid of k = 1 and k = T_j only: the certificate must come from branch and bound."""
    monkeypatch.setattr(suffix_maximum, "_GRID_RATIO", 10**9)
    _check_against_brute(*_history(random.Random(200 + seed), 300))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_sweep(seed):
    segments, delta = _history(random.Random(1000 + seed), random.Random(seed).choice([300, 3000]))
    _check_against_brute(segments, delta)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_matches_brute_force_sweep_without_grid(monkeypatch, seed):
    monkeypatch.setattr(suffix_maximum, "_GRID_RATIO", 10**9)
    _check_against_brute(*_history(random.Random(2000 + seed), 2000))


# -- single segment, large T ------------------------------------------------------------------


def _dense_check(steps: int, q: float, sigma: float, delta: float) -> SuffixMaximum:
    segments = (TrainingSegment(sigma, q, steps),)
    r = certified_suffix_maximum(segments, delta)

    def eps(t: int) -> float:
        return privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)

    assert r.attained == eps(r.argmax_steps)
    near = range(max(1, r.argmax_steps - 60), min(steps, r.argmax_steps + 60) + 1)
    sample = random.Random(steps).sample(range(1, steps + 1), 40)
    for t in [*near, *sample, 1, steps]:
        assert eps(t) <= r.epsilon
    assert r.attained <= r.epsilon <= r.attained * (1 + RTOL)
    assert r.evaluations < 200  # branch and bound, not a scan
    return r


def test_single_segment_large_monotone():
    r = _dense_check(100_000, 0.01, 1.0, 1e-6)
    assert r.argmax_steps == 100_000


def test_single_segment_small_sigma():
    """q = 0.05, sigma = 0.6: eps_t falls from t = 1 to about t = 10, then rises."""
    r = _dense_check(50, 0.05, 0.6, 1e-6)
    assert r.argmax_steps == 1
    m = heuristic_monotonicity(1e-6, steps=50, sample_rate=0.05, noise_multiplier=0.6)
    assert m.non_monotone and m.argmax_steps == 1 and m.max_epsilon == r.attained
    r = _dense_check(20_000, 0.05, 0.6, 1e-6)
    assert r.argmax_steps == 20_000


def test_single_segment_large_non_monotone():
    """Small q and sigma: one step (2.18) is the worst of all 100 000 suffixes (eps_T 1.78)."""
    r = _dense_check(100_000, 5e-4, 0.4, 1e-6)
    assert r.argmax_steps == 1
    m = heuristic_monotonicity(1e-6, steps=100_000, sample_rate=5e-4, noise_multiplier=0.4)
    assert m.non_monotone and m.max_epsilon == r.attained and m.max_epsilon_bound == r.epsilon


# -- edge cases -----------------------------------------------------------------------------


def test_empty_and_zero_step_segments():
    assert certified_suffix_maximum((), 1e-6) == SuffixMaximum(0.0, 0.0, 0, 0)
    zero = (TrainingSegment(1.0, 0.1, 0),)
    assert certified_suffix_maximum(zero, 1e-6) == SuffixMaximum(0.0, 0.0, 0, 0)
    with_gap = (TrainingSegment(0.7, 0.05, 30), TrainingSegment(1.0, 0.1, 0))
    _check_against_brute(with_gap, 1e-6)


def test_zero_rtol_certifies_the_attained_value():
    segments = (TrainingSegment(0.8, 0.02, 400), TrainingSegment(1.5, 0.05, 300))
    r = certified_suffix_maximum(segments, 1e-5, rtol=0.0)
    assert r.epsilon <= r.attained + 1e-12
    assert max(_brute(segments, 1e-5)) == pytest.approx(r.attained, rel=ENGINE)


@pytest.mark.parametrize(
    "kwargs,pattern",
    [(dict(rtol=-1e-3), "`rtol`"), (dict(rtol=float("nan")), "`rtol`"), (dict(delta=0.0), "`delta`")],
)
def test_bad_arguments(kwargs, pattern):
    args = dict(delta=1e-6) | kwargs
    with pytest.raises(ValueError, match=pattern):
        certified_suffix_maximum((TrainingSegment(1.0, 0.1, 5),), **args)  # type: ignore[arg-type]


# -- many segments (noise or rate changing every step) ---------------------------------------


def _changing(rng: random.Random, n: int) -> tuple[tuple[TrainingSegment, ...], float]:
    """n segments of 1-3 steps: sigma drifting in [0.5, 3] with jumps, q from a few rates."""
    sigma, out = 1.0, []
    rates = [0.01, 0.03, 0.2, 1.0]
    for _ in range(n):
        sigma = min(3.0, max(0.5, sigma * math.exp(rng.gauss(0.0, 0.08))))
        if rng.random() < 0.03:
            sigma = rng.uniform(0.5, 3.0)
        out.append(TrainingSegment(sigma, rng.choice(rates[: rng.randint(1, 4)]), rng.randint(1, 3)))
    return tuple(out), 10 ** rng.uniform(-8, -3)


@pytest.mark.parametrize("seed", range(3))
def test_many_segments_match_brute_force(seed):
    """More segments than the per-segment grids: one grid over the run, gaps across segment
    boundaries."""
    segments, delta = _changing(random.Random(300 + seed), 120)
    assert len(segments) > suffix_maximum._PER_SEGMENT_GRIDS
    _check_against_brute(segments, delta)


@pytest.mark.parametrize("seed", range(2))
def test_few_segments_with_one_grid_over_the_run_match_brute_force(monkeypatch, seed):
    monkeypatch.setattr(suffix_maximum, "_PER_SEGMENT_GRIDS", 0)
    _check_against_brute(*_history(random.Random(400 + seed), 300))


@pytest.mark.parametrize("seed", range(2))
def test_many_rates_without_the_rate_table_match_brute_force(monkeypatch, seed):
    monkeypatch.setattr(suffix_maximum, "_RATE_TABLE_MAX", 0)
    segments, delta = _changing(random.Random(500 + seed), 90)
    _check_against_brute(segments, delta)


def test_bound_across_segment_boundaries_dominates_every_interior_value():
    rng = random.Random(7)
    segments, delta = _changing(rng, 80)
    values = _brute(segments, delta)
    search = suffix_maximum._Search(segments, delta)
    for _ in range(30):
        lo = rng.randint(0, len(values) - 3)
        hi = rng.randint(lo + 2, len(values))
        assert search.bound(lo, hi) >= max(values[lo : hi - 1])


def test_noise_changing_every_step_is_not_a_scan():
    """20,000 one-step segments, sigma_t = 0.99999^t: far fewer evaluations than steps, and
    the bound is at least eps_t at every sampled t (each computed from scratch)."""
    segments = tuple(TrainingSegment(0.99999**t, 0.01, 1) for t in range(20_000))
    delta = 1e-5
    r = certified_suffix_maximum(segments, delta)
    assert r.evaluations < 300
    sample = random.Random(1).sample(range(1, 20_001), 25)
    near = range(max(1, r.argmax_steps - 5), min(20_000, r.argmax_steps + 5) + 1)
    for t in [*sample, *near, 1, 20_000]:
        assert segments_epsilon(suffix(segments, t), delta) <= r.epsilon
    assert r.attained == segments_epsilon(suffix(segments, r.argmax_steps), delta)
    assert r.epsilon <= r.attained * (1 + RTOL) + 1e-12
