"""The standard (PLD) value of a run whose noise changes at every step: composed incrementally
across calls (the same float as from scratch) and, with ``noise_grouping``, an upper bound
checked against dp_accounting's ``PLDAccountant`` composing every step's own event.

Tolerances: our composition skips dp_accounting's truncation after a one-step segment, so
its epsilon may be below dp_accounting's by at most 1e-6 relative at delta = 1e-5
(``test_pld_composition``); with the noise grouped, every noise multiplier is lowered by at
most a factor ``1 + g``, so the value lies between dp_accounting's for the run and
dp_accounting's for the run with every noise multiplier divided by ``1 + g``."""

from __future__ import annotations

import dp_accounting
import pytest

from opacus_lastiterate.analysis.baselines import pld_composition
from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.baselines.pld_composition import (
    CompositionCache,
    compose_subsampled_gaussian,
    group_noise,
)
from opacus_lastiterate.analysis.run import DPSGDRun
from tests._pmf_builds import record_pmf_builds

INTERVAL, DELTA = 1e-3, 1e-5


def _history(steps, decay=0.97, q=0.05):
    return [(1.2 * decay**t, q, 1) for t in range(steps)]


def _dp_accounting(history, interval=INTERVAL):
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=interval,
    )
    for sigma, q, n in history:
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n)
    return acc.get_epsilon(DELTA)


@pytest.mark.parametrize("cut", [1, 7, 12])
def test_a_growing_run_gives_the_float_of_a_fresh_composition(cut):
    history = _history(12) + [(0.5, 0.05, 3)]
    cache = CompositionCache()
    cache.pld(history[:cut], INTERVAL)  # kept
    for end in (cut, cut + 1, len(history)):
        got = cache.pld(history[:end], INTERVAL).get_epsilon_for_delta(DELTA)
        fresh = compose_subsampled_gaussian(history[:end], INTERVAL).get_epsilon_for_delta(DELTA)
        assert got == fresh


def test_a_segment_that_grew_or_a_run_that_diverged_is_composed_right():
    cache = CompositionCache()
    base = [(1.0, 0.05, 4), (0.8, 0.05, 2)]
    cache.pld(base, INTERVAL)
    for history in (
        [(1.0, 0.05, 4), (0.8, 0.05, 5)],  # the last segment has more steps
        [(1.0, 0.05, 4), (0.7, 0.05, 2)],  # the last segment is another one
        [(1.0, 0.05, 3)],  # a shorter run
        [(0.9, 0.1, 4), (0.8, 0.05, 2)],  # another run
    ):
        got = cache.pld(history, INTERVAL).get_epsilon_for_delta(DELTA)
        assert got == compose_subsampled_gaussian(history, INTERVAL).get_epsilon_for_delta(DELTA)


def test_one_more_step_builds_one_more_one_step_pld(monkeypatch):
    calls = record_pmf_builds(monkeypatch)
    history = _history(30, decay=0.99)
    StandardComposition(history[:29], value_discretization_interval=INTERVAL).epsilon(DELTA)
    calls.clear()
    StandardComposition(history, value_discretization_interval=INTERVAL).epsilon(DELTA)
    assert len(calls) == 1 and calls[0][0][0] == history[-1][0]


@pytest.mark.parametrize("grouping", [0.0, 0.02, 0.1])
def test_grouped_noise_is_an_upper_bound_within_its_factor(grouping):
    history = _history(15, decay=0.99)
    run = DPSGDRun.from_history(history)
    ours = StandardComposition(
        run, value_discretization_interval=INTERVAL, noise_grouping=grouping
    ).epsilon(DELTA)
    exact = _dp_accounting(history)
    lowered = _dp_accounting([(s / (1 + grouping), q, n) for s, q, n in history])
    assert exact * (1 - 1e-6) <= ours <= lowered * (1 + 1e-6)
    if grouping:  # fewer one-step PLDs, and a looser value than without grouping
        assert len(group_noise(history, grouping)) < len(history)
        plain = StandardComposition(
            run, value_discretization_interval=INTERVAL, noise_grouping=0
        ).epsilon(DELTA)
        assert ours >= plain


def test_group_noise_merges_within_the_factor_at_the_smallest_noise():
    history = [(1.0, 0.1, 2), (0.995, 0.1, 1), (1.004, 0.1, 3), (0.98, 0.1, 1), (0.98, 0.2, 1)]
    assert group_noise(history, 0.01) == [(0.995, 0.1, 6), (0.98, 0.1, 1), (0.98, 0.2, 1)]
    assert group_noise(history, 0.0) == [h for h in history]
    # the groups of a prefix are the run's, except the last, which may grow
    run = _history(40, decay=0.995)
    full = group_noise(run, 0.02)
    for end in range(1, 41):
        part = group_noise(run[:end], 0.02)
        assert part[:-1] == full[: len(part) - 1]
        assert part[-1][2] <= full[len(part) - 1][2]


@pytest.mark.parametrize("bad,error", [(-0.1, ValueError), (1.0, ValueError), ("x", TypeError)])
def test_noise_grouping_is_validated(bad, error):
    with pytest.raises(error, match="noise_grouping"):
        StandardComposition(_history(3), noise_grouping=bad)


@pytest.mark.parametrize("sigma,q,steps", [(0.9, 0.05, 10), (1.5, 0.2, 37), (0.7, 1.0, 6)])
def test_self_composition_by_squaring_is_an_upper_bound_close_to_dp_accountings(sigma, q, steps):
    composer = pld_composition.PLDComposer(INTERVAL, squaring=True)
    composer.add(sigma, q, steps)
    ours = composer.pld()
    ref = _dp_accounting([(sigma, q, steps)])
    eps = ours.get_epsilon_for_delta(DELTA)
    # each of the about 2 log2(steps) truncating convolutions moves at most 1e-15 of mass
    # up (to infinity or onto a higher loss): delta only grows, by at most 1e-13 here
    assert ref * (1 - 1e-9) <= eps <= ref * (1 + 1e-6)
    for e in (0.0, 0.5, 1.0, 2.0):
        exact = compose_subsampled_gaussian([(sigma, q, steps)], INTERVAL).get_delta_for_epsilon(e)
        got = ours.get_delta_for_epsilon(e)
        assert exact * (1 - 1e-9) - 1e-18 <= got <= exact * (1 + 1e-9) + 1e-13


def test_by_default_steady_or_stepped_noise_is_composed_as_dp_accounting_composes_it():
    for history in ([(1.1, 0.05, 20)], [(1.0, 0.05, 5), (0.95, 0.05, 4), (1.2, 0.1, 3)]):
        ours = StandardComposition(history, value_discretization_interval=INTERVAL)
        fresh = compose_subsampled_gaussian(history, INTERVAL)
        assert ours.epsilon(DELTA) == fresh.get_epsilon_for_delta(DELTA)


def test_by_default_a_drifting_noise_is_grouped_within_a_tenth_of_a_percent():
    history = _history(40, decay=0.9999)
    ours = StandardComposition(history, value_discretization_interval=INTERVAL).epsilon(DELTA)
    exact = _dp_accounting(history)
    lowered = _dp_accounting([(s / 1.001, q, n) for s, q, n in history])
    assert len(group_noise(history, 1e-3)) == 4
    assert exact * (1 - 1e-6) <= ours <= lowered * (1 + 1e-6)


# -- the work bound (max_groups): a schedule that changes at every step -------------------------


@pytest.mark.parametrize(
    "history",
    [
        _history(12, decay=0.97),  # the noise falls at every step
        [(1.2, 0.04 * 1.02**t, 1) for t in range(12)],  # the sample rate grows at every step
        [(1.0 + 0.2 * (t % 5), 0.05, 1) for t in range(12)],  # a cycle (not monotone)
    ],
)
def test_a_bounded_composition_is_an_upper_bound_within_its_reported_factor(history):
    model = StandardComposition(history, value_discretization_interval=INTERVAL, max_groups=3)
    interval, grouping, groups = model.settings
    assert groups <= 3 and grouping > 0 and interval >= INTERVAL
    ours = model.epsilon(DELTA)
    exact = _dp_accounting(history)
    # every noise multiplier lowered and every sample rate raised by at most 1 + grouping
    factor = 1 + grouping
    worse = [(s / factor, min(1.0, q * factor), n) for s, q, n in history]
    assert exact * (1 - 1e-6) <= ours <= _dp_accounting(worse) * (1 + 1e-6)


def test_the_bound_leaves_a_run_within_it_as_it_was():
    history = _history(12, decay=0.97)
    bounded = StandardComposition(history, value_discretization_interval=INTERVAL, max_groups=12)
    free = StandardComposition(history, value_discretization_interval=INTERVAL, max_groups=None)
    assert bounded.settings == (INTERVAL, 1e-3, 12)
    assert bounded.epsilon(DELTA) == free.epsilon(DELTA)


def test_a_long_schedule_is_composed_with_at_most_max_groups_pmfs(monkeypatch):
    history = [(0.999**t, 0.01, 1) for t in range(2000)]
    built = record_pmf_builds(monkeypatch)
    pld_composition.clear_kept_compositions()
    model = StandardComposition(history, max_groups=64)
    interval, _, groups = model.settings
    assert model.epsilon(DELTA) > 0 and len(built) == groups <= 64
    # the least private (last) group's one-step PLD spans at most GRID_POINTS (8192) points
    assert interval > 1e-4 and built[-1][1][0].probs.size <= 8192 + 2


@pytest.mark.parametrize("bad,error", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_max_groups_is_validated(bad, error):
    with pytest.raises(error, match="max_groups"):
        StandardComposition(_history(3), max_groups=bad)


def test_a_growing_bounded_run_keeps_its_rung_and_composes_only_its_new_groups(monkeypatch):
    history = [(0.999**t, 0.01, 1) for t in range(1550)]
    first = StandardComposition(history[:1460], max_groups=64)
    second = StandardComposition(history, max_groups=64)
    assert first.settings[:2] == second.settings[:2]  # the same rung of the ladder
    pld_composition.clear_kept_compositions()
    first.epsilon(DELTA)
    built = record_pmf_builds(monkeypatch)
    grown = second.epsilon(DELTA)
    assert len(built) <= second.settings[2] - first.settings[2] + 1
    pld_composition.clear_kept_compositions()
    assert StandardComposition(history, max_groups=64).epsilon(DELTA) == grown


def test_settings_without_a_bound_are_the_requested_ones():
    history = [(0.999**t, 0.01, 1) for t in range(300)]
    free = StandardComposition(history, max_groups=None)
    assert free.settings == (1e-4, 1e-3, len(group_noise(history, 1e-3)))
    assert StandardComposition(history).settings[0] > 1e-4  # the default bound widens the grid
