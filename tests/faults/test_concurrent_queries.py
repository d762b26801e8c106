"""An accountant asked from a second thread while training records steps answers with the
epsilon of some prefix of the run (never a value mixed from two states) and never keeps
such a value: queries and recorded steps are serialised by the accountant's lock."""

from __future__ import annotations

import math
import sys
import threading

import pytest

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings

DELTA = 1e-5
STEPS = 400


def _settings(t: int) -> SGDSettings:
    lr = 0.1 * 0.5 * (1 + math.cos(math.pi * t / STEPS)) + 1e-3
    return SGDSettings(lr=lr, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=0.0)


def _prefix_epsilons() -> list[float]:
    """epsilon after each number of steps, asked on one thread."""
    acc = LastIterateAccountant()
    values = [acc.get_epsilon(DELTA)]
    for t in range(STEPS):
        acc.replay_step(1.0, 0.02, _settings(t))
        values.append(acc.get_epsilon(DELTA))
    return values


@pytest.mark.parametrize("repeat", range(3))
def test_a_query_from_another_thread_is_the_epsilon_of_a_prefix(repeat: int) -> None:
    reference = _prefix_epsilons()
    acc = LastIterateAccountant()
    seen: list[float] = []
    done = threading.Event()

    def ask() -> None:
        while not done.is_set():
            seen.append(acc.get_epsilon(DELTA))

    asker = threading.Thread(target=ask)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside a step, if nothing prevents it
    asker.start()
    try:
        for t in range(STEPS):
            acc.replay_step(1.0, 0.02, _settings(t))
    finally:
        done.set()
        asker.join(timeout=60)
        sys.setswitchinterval(interval)
    assert not asker.is_alive()
    assert seen
    # each value is the weighted heuristic of some prefix, rounded up to within the
    # accountant's weight_accuracy (1e-3 relative) as the reference is: within 2e-3 of it
    for value in seen:
        nearest = min(reference, key=lambda r: abs(r - value))
        assert value == pytest.approx(nearest, rel=2 * acc.weight_accuracy, abs=1e-12), value
    assert acc.get_epsilon(DELTA) == pytest.approx(reference[-1], rel=2 * acc.weight_accuracy)


def test_an_accountant_with_its_lock_still_copies_and_pickles() -> None:
    import copy
    import pickle

    acc = LastIterateAccountant()
    acc.replay_step(1.0, 0.02, _settings(0))
    for twin in (copy.deepcopy(acc), pickle.loads(pickle.dumps(acc)), acc.with_history([(1.0, 0.02, 3)])):
        twin.replay_step(1.0, 0.02, _settings(1))
        assert twin.get_epsilon(DELTA) > 0
