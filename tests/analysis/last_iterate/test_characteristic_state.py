"""A saved characteristic function (a checkpoint): restored onto the same run it continues
exactly as if it had never been saved, without rebuilding its grid (a half-built next grid
included); onto any other run, or malformed, it is not restored at all. New grids (rebuilt
from the run, or the shadow built ahead) bracket the from-scratch value; a grid that fits but
no longer certifies is replaced once per failure, not at every query."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.incremental_fourier import (
    IncrementalCharacteristic,
    run_fingerprint,
)
from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
    cosine_schedule,
)

ACC, DELTA, Q, SIGMA = 1e-3, 1e-5, 0.045, 2.0
SETTINGS = (0.9, 0.0, False)


def _lists(n: int) -> tuple[list[float], list[float], list[float]]:
    return cosine_schedule(0.5, n).tolist(), [SIGMA] * n, [Q] * n


def _scratch(eta: list, sigma: list, q: list) -> SimpleNamespace:
    """The bracket of a new instance asked once (from scratch: every step frozen at its
    weight then)."""
    got = IncrementalCharacteristic(*SETTINGS).solve(DELTA, eta, sigma, q, ACC)
    assert got is not None
    return SimpleNamespace(value=got[0], lower_bound=got[1])


def _grown(n: int, every: int = 7) -> tuple[IncrementalCharacteristic, tuple[list, list, list]]:
    eta, sigma, q = _lists(n)
    char = IncrementalCharacteristic(*SETTINGS)
    for t in range(1, n + 1):
        if t % every == 0:
            assert char.solve(DELTA, eta[:t], sigma[:t], q[:t], ACC) is not None
    return char, (eta, sigma, q)


def test_restored_state_continues_bit_identically_without_rebuilding() -> None:
    n, more = 723, 250
    char, (eta, sigma, q) = _grown(n)
    shadow = char.shadow
    assert shadow is not None and shadow.cursor < char.frozen  # the next grid half built
    switches = char.switches
    state = json.loads(json.dumps(char.state(eta, sigma, q)))  # plain data, exactly
    _, sigma2, q2 = _lists(n + more)
    eta2 = eta + [0.5] * more  # the same run, continued at a higher rate (new grids)
    restored = IncrementalCharacteristic.from_state(state, eta2[:n], sigma2[:n], q2[:n], SETTINGS)
    assert restored is not None
    rebuilds = restored.rebuilds
    for t in range(n + 1, n + more + 1):
        a = char.solve(DELTA, eta2[:t], sigma2[:t], q2[:t], ACC)
        b = restored.solve(DELTA, eta2[:t], sigma2[:t], q2[:t], ACC)
        assert a == b  # the same floats
    assert restored.rebuilds == rebuilds == char.rebuilds
    assert restored.switches == char.switches > switches  # it took the restored shadow over


def test_restored_state_after_more_steps_answers_the_longer_run() -> None:
    n = 500
    char, (eta, sigma, q) = _grown(n)
    state = char.state(eta, sigma, q)
    eta2, sigma2, q2 = _lists(n + 40)
    eta2[:n] = eta
    restored = IncrementalCharacteristic.from_state(state, eta2, sigma2, q2, SETTINGS)
    assert restored is not None
    got = restored.solve(DELTA, eta2, sigma2, q2, ACC)
    scratch = _scratch(eta2, sigma2, q2)
    assert got is not None
    upper, lower, _ = got
    assert lower <= scratch.value and scratch.lower_bound <= upper


@pytest.mark.parametrize(
    "change",
    ["lr", "sigma", "q", "settings", "shorter run", "format", "garbage", "vector length"],
)
def test_state_of_another_run_or_malformed_is_not_restored(change: str) -> None:
    n = 300
    char, (eta, sigma, q) = _grown(n)
    state = copy.deepcopy(char.state(eta, sigma, q))
    eta, sigma, q, settings = list(eta), list(sigma), list(q), SETTINGS
    if change == "lr":
        eta[17] *= 1.0 + 1e-15
    elif change == "sigma":
        sigma[100] = 2.5
    elif change == "q":
        q[0] = 0.05
    elif change == "settings":
        settings = (0.9, 0.0, True)
    elif change == "shorter run":
        eta, sigma, q = eta[:200], sigma[:200], q[:200]  # fewer steps than were saved
    elif change == "format":
        state["format"] = 0
    elif change == "garbage":
        state["grid"]["lo"] = "a"
    else:
        state["grid"]["size"] = state["grid"]["size"][:-1]
    assert IncrementalCharacteristic.from_state(state, eta, sigma, q, settings) is None


def test_fingerprint_depends_on_every_input() -> None:
    eta, sigma, q = _lists(50)
    base = run_fingerprint(eta, sigma, q, SETTINGS)
    assert base == run_fingerprint(list(eta), list(sigma), list(q), SETTINGS)
    for i in range(3):
        lists = [list(eta), list(sigma), list(q)]
        lists[i][25] = np.nextafter(lists[i][25], 1.0)
        assert run_fingerprint(*lists, SETTINGS) != base
    assert run_fingerprint(eta, sigma, q, (0.9, 0.1, False)) != base


def test_engine_restores_only_onto_its_run() -> None:
    n = 400
    eta, sigma, q = _lists(n)
    engine = IncrementalWeightedHeuristic(ACC)
    for t in range(n):
        engine.append(sigma[t], q[t], eta[t], 0.9)
        if t % 50 == 49:
            engine.epsilon(DELTA)
    state = engine.characteristic_state()
    assert state is not None
    again = IncrementalWeightedHeuristic(ACC)
    other = IncrementalWeightedHeuristic(ACC)
    for t in range(n):
        again.append(sigma[t], q[t], eta[t], 0.9)
        other.append(sigma[t], q[t], eta[t], 0.8)
    assert again.restore_characteristic(state)
    assert not other.restore_characteristic(state)
    engine.append(SIGMA, Q, 0.01, 0.9)
    again.append(SIGMA, Q, 0.01, 0.9)
    assert engine.epsilon(DELTA) == again.epsilon(DELTA)


def test_new_grids_bracket_the_scratch_value() -> None:
    """Grids rebuilt as the run grows refreeze every frozen step from the run itself, and
    grids taken over from the shadow were built a block per query: at every query where
    the grid changed (and at the queries after), the bracket holds the from-scratch value."""
    n = 3000
    eta, sigma, q = _lists(n)
    char = IncrementalCharacteristic(*SETTINGS)
    checked, after = 0, 0
    for t in range(1, n + 1):
        grids = char.rebuilds + char.switches
        got = char.solve(DELTA, eta[:t], sigma[:t], q[:t], ACC)
        if (char.rebuilds + char.switches > grids and char.frozen > 0) or after:
            assert got is not None
            scratch = _scratch(eta[:t], sigma[:t], q[:t])
            assert got[1] <= scratch.value and scratch.lower_bound <= got[0]
            checked += 1
            after = 3 if char.rebuilds + char.switches > grids else after - 1
    assert char.switches >= 2  # the grid was taken over from a shadow more than once
    assert checked >= 8


def test_a_grid_that_no_longer_certifies_is_replaced_once() -> None:
    """A grid that still fits but whose query fails (worn margins) is replaced by a new one
    for that query; when the new grid fails as well, no other grid is tried until the run
    is twice as long (the caller answers from scratch meanwhile)."""

    class Worn(IncrementalCharacteristic):
        failing: ClassVar[set[int]] = set()
        fail_all: ClassVar[bool] = False

        def _evaluate(self, grid, *args):  # type: ignore[no-untyped-def]
            if self.fail_all or id(grid) in self.failing:
                return None
            return super()._evaluate(grid, *args)

    n = 400
    eta, sigma, q = _lists(n)
    char = Worn(*SETTINGS)
    for t in range(1, n):
        assert char.solve(DELTA, eta[:t], sigma[:t], q[:t], ACC) is not None
    worn = char.grid
    grids = char.rebuilds + char.switches
    Worn.failing = {id(worn)}
    got = char.solve(DELTA, eta, sigma, q, ACC)
    assert got is not None and char.grid is not worn
    assert char.rebuilds + char.switches == grids + 1
    scratch = _scratch(eta, sigma, q)
    assert got[1] <= scratch.value and scratch.lower_bound <= got[0]
    # every grid fails from now on: one more try, then (while the grid fits) none until the
    # run doubles; without that, a new O(T M) grid at every query
    Worn.fail_all = True
    eta2, sigma2, q2 = _lists(2 * n + 2)
    tried = char.rebuilds + char.switches
    for t in range(n + 1, 2 * n + 1):
        assert char.solve(DELTA, eta2[:t], sigma2[:t], q2[:t], ACC) is None
    assert tried + 1 <= char.rebuilds + char.switches <= tried + 3
