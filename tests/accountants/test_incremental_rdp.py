"""IncrementalRDP against Opacus's own RDPAccountant on histories whose noise and rate
change (relative 1e-9 on epsilon)."""

from __future__ import annotations

import numpy as np
import pytest
from opacus.accountants import RDPAccountant

from opacus_lastiterate.accountants.incremental_rdp import IncrementalRDP


@pytest.mark.parametrize("seed", [0, 1])
def test_changing_noise_matches_opacus_accountant(seed):
    rng = np.random.default_rng(seed)
    history = [
        (float(10 ** rng.uniform(-0.3, 1.0)), float(10 ** rng.uniform(-3, -0.5)),
         int(rng.integers(1, 30)))
        for _ in range(12)
    ]
    reference = RDPAccountant()
    reference.history = list(history)
    ours = IncrementalRDP()
    ours.reset(history)
    for delta in (1e-5, 1e-7):
        assert ours.epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=1e-9)


def test_advance_one_step_at_a_time_matches_opacus_accountant():
    steps = [(0.999**t, 0.02) for t in range(30)]
    ours = IncrementalRDP()
    eps = ours.advance(steps, 1e-5)
    reference = RDPAccountant()
    for t, (sigma, q) in enumerate(steps):
        reference.step(noise_multiplier=sigma, sample_rate=q)
        if t in (0, 9, 29):
            assert eps[t] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-9)


def test_a_batch_of_new_noise_multipliers_gives_the_floats_of_one_at_a_time():
    """advance() evaluates the series of every new (sigma, q) of a noise schedule in one call:
    the vector after each step is the one add() reaches a step at a time, bit for bit, and
    a pair seen again (here the first) is not evaluated anew."""
    steps = [(0.999**t, 0.02) for t in range(40)] + [(1.0, 0.02), (0.5, 0.3)]
    batched, single = IncrementalRDP(), IncrementalRDP()
    eps = batched.advance(steps, 1e-5)
    for sigma, q in steps:
        single.add(sigma, q)
    assert np.array_equal(batched.rdp, single.rdp)
    assert eps[-1] == single.epsilon(1e-5)
