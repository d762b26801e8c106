"""The weighted heuristic after every step of a batch, answered together
(:meth:`IncrementalCharacteristic.solve_steps`, :mod:`.fourier_batch`): brackets that hold
the exact value (every inclusion pattern enumerated), that overlap those of a fresh instance
asked at the step alone, and a state that moves on a query per block."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate import fourier_batch, incremental_fourier
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
)

ACC = 1e-3
CASES = {
    "momentum-cosine": (lambda n: cosine_schedule(0.5, n), 0.9, 0.0, False),
    "nesterov-cosine": (lambda n: cosine_schedule(0.2, n), 0.9, 0.0, True),
    "dampening": (lambda n: cosine_schedule(0.3, n), 0.8, 0.3, False),
    "warmup": (lambda n: np.minimum(1.0, np.arange(1, n + 1) / 60.0) * 0.3, 0.95, 0.0, False),
}


def _lists(lrs, q, sigma):
    return [float(x) for x in lrs], [float(x) for x in sigma], [float(x) for x in q]


def _scratch(eta, sigma, q, t, settings, delta=1e-5):
    """A new instance asked once, at step t (every step frozen at its weight then: no
    first-order terms, no block update)."""
    got = IncrementalCharacteristic(*settings).solve(delta, eta[:t], sigma[:t], q[:t], ACC)
    return None if got is None else SimpleNamespace(value=got[0], lower_bound=got[1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_step_of_batches_against_a_fresh_instance(name, monkeypatch):
    n = 400
    sched, beta, damp, nest = CASES[name]
    q = np.where(np.arange(n) % 3 == 0, 0.03, 0.06)
    sigma = np.where(np.arange(n) % 5 == 0, 1.8, 2.5)
    eta, ss, qq = _lists(sched(n), q, sigma)
    solves = []
    solve = IncrementalCharacteristic.solve

    def counted(self, *args, **kwargs):
        solves.append(kwargs.get("n"))
        return solve(self, *args, **kwargs)

    monkeypatch.setattr(IncrementalCharacteristic, "solve", counted)
    inc = IncrementalCharacteristic(beta, damp, nest)
    got = {}
    for start, stop in ((0, 50), (50, 170), (170, 171), (171, 400)):  # flushed batches
        answers = inc.solve_steps(1e-5, eta[:stop], ss[:stop], qq[:stop], ACC, start)
        assert len(answers) == stop - start
        got.update(zip(range(start + 1, stop + 1), answers, strict=True))
    assert all(a is not None for a in got.values())
    # the state moves on a query per block (more often while the grid is outgrown: early
    # on, when the run doubles fast), and at each batch's last step: after step 100 at
    # most a tenth of the steps go to solve (a declined block row would send every one)
    late = [t for t in solves if t > 100]
    assert len(late) <= (n - 100) // 10
    monkeypatch.setattr(IncrementalCharacteristic, "solve", solve)
    for t in (2, 3, 17, 51, 60, 150, 171, 233, 301, 399, 400):
        ref = _scratch(eta, ss, qq, t, (beta, damp, nest))
        upper, lower, _ = got[t]
        assert lower <= upper and (upper - lower) / upper <= ACC
        # both brackets hold the exact value: they overlap
        assert upper >= ref.lower_bound * (1 - 1e-12) and lower <= ref.value * (1 + 1e-12)
        assert upper <= ref.value * (1 + 10 * incremental_fourier.FREEZE_ERROR)


def _enumerated(w, q, sigma, delta):
    bits = np.array(list(itertools.product([0, 1], repeat=w.size)), dtype=float)
    probs = np.prod(np.where(bits == 1, q, 1 - q), axis=1)
    s = math.sqrt(float(np.sum((w * sigma) ** 2)))
    with np.errstate(divide="ignore"):  # q = 1: patterns of probability 0
        log_p = np.log(probs)
    return ShiftedGaussianMixture(bits @ w, log_p, s).epsilon(delta)


def test_every_row_of_a_block_brackets_the_enumerated_value(monkeypatch):
    """Every inclusion pattern of short momentum runs; freezing forced early (a large
    FREEZE_ERROR), so that the block's first-order terms and remainder bound matter. The
    rows of a block from the state at step 5 (None where the run has outgrown its grid,
    frequent in runs this short) and every answer of solve_steps hold the exact value
    (solve declines some of the first steps, as asked step by step)."""
    monkeypatch.setattr(incremental_fourier, "FREEZE_ERROR", 3e-4)
    monkeypatch.setattr(incremental_fourier, "_FREEZE_BLOCK", 1)
    block_rows = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(10, 14))
        lrs = rng.uniform(0.05, 0.5, n)
        q = rng.choice([0.05, 0.2, 0.7, 1.0], n)
        sigma = rng.uniform(0.8, 3.0, n)
        beta = float(rng.choice([0.3, 0.5]))
        eta, ss, qq = _lists(lrs, q, sigma)
        inc = IncrementalCharacteristic(beta, 0.0, False)
        first = inc.solve_steps(1e-3, eta[:5], ss[:5], qq[:5], 0.5, 0)
        rows = fourier_batch.block_answers(inc, 1e-3, eta, ss, qq, 0.5, n + 1)
        got = inc.solve_steps(1e-3, eta, ss, qq, 0.5, 5)
        block_rows += sum(r is not None for r in rows)
        answers = [*enumerate(first + got, start=1), *enumerate(rows, start=6)]
        assert got[-1] is not None
        for t, answer in answers:
            if answer is None:
                continue  # a block row not answered, or a step solve declines
            exact = _enumerated(sgd_weights(lrs[:t], momentum=beta), q[:t], sigma[:t], 1e-3)
            upper, lower, _ = answer
            assert lower * (1 - 1e-9) - 1e-12 <= exact <= upper * (1 + 1e-9) + 1e-12
    assert block_rows >= 8


def test_another_delta_than_the_grid_is_asked_step_by_step():
    """A block is answered only on the grid of its delta: at another delta every step goes
    to solve, with the answers of solve asked step by step."""
    n = 120
    eta, ss, qq = _lists(cosine_schedule(0.5, n), np.full(n, 0.05), np.full(n, 2.0))
    a, b = IncrementalCharacteristic(0.9, 0.0, False), IncrementalCharacteristic(0.9, 0.0, False)
    for inc in (a, b):
        inc.solve(1e-5, eta[:60], ss[:60], qq[:60], ACC)
    got = a.solve_steps(1e-7, eta, ss, qq, ACC, 60)
    ref = [b.solve(1e-7, eta[:t], ss[:t], qq[:t], ACC) for t in range(61, n + 1)]
    assert got == ref


def test_engine_epsilons_equal_its_epsilon_step_by_step():
    """IncrementalWeightedHeuristic.epsilons: the results epsilon gives after each step (to
    the root refinement's tolerance), None outside the Fourier route's scope."""
    n = 300
    lrs = cosine_schedule(0.5, n)
    batch, single = IncrementalWeightedHeuristic(ACC), IncrementalWeightedHeuristic(ACC)
    values, ref = [], []
    for t in range(n):
        for engine in (batch, single):
            engine.append(2.0, 0.05, float(lrs[t]), 0.9)
        ref.append(single.epsilon(1e-5).epsilon)
        if (t + 1) % 100 == 0:
            values += [r.epsilon for r in batch.epsilons(1e-5, 100)]
    assert values == pytest.approx(ref, rel=1e-7)
    assert batch.epsilon(1e-5).epsilon == values[-1]  # the last one is kept
    decayed = IncrementalWeightedHeuristic(ACC)
    for t in range(5):
        decayed.append(2.0, 0.05, float(lrs[t]), 0.9, weight_decay=1e-4)
    assert decayed.epsilons(1e-5, 5) == [None] * 5
