"""The weighted engine keeps a long run as arrays: memory per recorded step, and the answers
of a run recorded step by step against the same run recorded in one batch and against the
weight grid from scratch (an independent route)."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np

from opacus_lastiterate.analysis.last_iterate.incremental_weighted import (
    IncrementalWeightedHeuristic,
)
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import sgd_weights
from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import solve_trusted

ACC = 1e-3


def test_a_long_run_costs_a_few_dozen_bytes_a_step():
    steps = 50_000
    engine = IncrementalWeightedHeuristic(ACC)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for t in range(steps):  # a new rate at every step, as a cosine schedule gives
            engine.append(20.0, 0.0445, 0.05 * (1 + math.cos(math.pi * t / steps)) / 2, 0.9)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # three float64 columns (24 bytes a step) in a buffer grown by doubling: at most 48
    # bytes a step; three Python floats and a tuple a step would be over 150
    assert used <= 48 * steps + 100_000
    assert engine.num_steps == steps


def test_step_by_step_batch_and_settings_runs_answer_alike():
    rng = np.random.default_rng(3)
    n = 400
    lr = rng.uniform(0.01, 0.1, n)
    sigma = rng.uniform(0.8, 1.5, n)
    q = np.full(n, 0.02)
    momentum = np.where(np.arange(n) < 150, 0.9, 0.5)  # two runs of settings: the grid route
    one, many = IncrementalWeightedHeuristic(ACC), IncrementalWeightedHeuristic(ACC)
    for t in range(n):
        one.append(sigma[t], q[t], lr[t], momentum[t])
    many.extend(sigma, q, lr, momentum, np.zeros(n), np.zeros(n, bool), np.zeros(n))
    a, b = one.epsilon(1e-5), many.epsilon(1e-5)
    assert a.value == b.value
    w = sgd_weights(lr, momentum=momentum, dampening=np.zeros(n), nesterov=False,
                    weight_decay=np.zeros(n))
    ref = solve_trusted("epsilon", 1e-5, w[w > 0], q[w > 0], sigma[w > 0], ACC)
    assert ref.lower_bound <= a.value and a.lower_bound <= ref.value
