"""The weighted heuristic asked at every step after a long gap has no stall: no query of the
recorded pattern takes more than 20 times the median query (a ratio on the same machine,
each query the minimum of repeats of the whole pattern, so that noise does not decide). And a
checkpoint carries the kept characteristic function: a loaded accountant continues with the
same floats as one never saved."""

from __future__ import annotations

import statistics
import time

import pytest

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.accountants.optimizer_trace import trace_as_lists
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings, cosine_schedule

GAP, QUERIES, REPEATS = 400, 24, 3


def _pattern() -> list[float]:
    """Seconds of each get_epsilon after GAP unqueried steps, one query per step."""
    lrs = cosine_schedule(0.5, GAP + QUERIES)
    acc = LastIterateAccountant()
    times = []
    for t, lr in enumerate(lrs, 1):
        acc.replay_step(1.0, 0.045, SGDSettings(float(lr), 0.9, 0.0, False, 0.0))
        if t > GAP:
            t0 = time.perf_counter()
            acc.get_epsilon(1e-5)
            times.append(time.perf_counter() - t0)
    assert acc.uses_weights
    return times


def test_no_query_after_a_long_gap_stalls() -> None:
    runs = [_pattern() for _ in range(REPEATS)]
    per_query = [min(r[i] for r in runs) for i in range(QUERIES)]
    median = statistics.median(per_query)
    worst = max(range(QUERIES), key=per_query.__getitem__)
    assert per_query[worst] <= 20 * median, (
        f"query {worst + 1} after the gap took {per_query[worst] * 1e3:.1f} ms, "
        f"{per_query[worst] / median:.1f}x the median {median * 1e3:.2f} ms"
    )


# -- a checkpoint: the kept characteristic function travels in the state_dict -----------------


def _trained(steps: int, every: int = 10) -> LastIterateAccountant:
    acc = LastIterateAccountant()
    for t, lr in enumerate(cosine_schedule(0.5, steps), 1):
        acc.replay_step(2.0, 0.045, SGDSettings(float(lr), 0.9, 0.0, False, 0.0))
        if t % every == 0:
            acc.get_epsilon(1e-5)
    return acc


def _continue(acc: LastIterateAccountant, steps: int = 30) -> list[float]:
    out = []
    for lr in cosine_schedule(0.05, steps):
        acc.replay_step(2.0, 0.045, SGDSettings(float(lr), 0.9, 0.0, False, 0.0))
        out.append(acc.get_epsilon(1e-5))
    return out


def test_loaded_state_continues_exactly_and_survives_torch_weights_only(tmp_path) -> None:
    import torch

    acc = _trained(600)
    state = acc.state_dict()
    assert "weighted_characteristic" in state
    torch.save(state, tmp_path / "acc.pt")
    loaded = LastIterateAccountant()
    loaded.load_state_dict(torch.load(tmp_path / "acc.pt", weights_only=True))
    # the cache was taken up, not dropped: saved again at once, it is the same state
    assert loaded.state_dict()["weighted_characteristic"] == state["weighted_characteristic"]
    without = LastIterateAccountant()
    without.load_state_dict({k: v for k, v in state.items() if k != "weighted_characteristic"})
    expected = _continue(acc)
    assert _continue(loaded) == expected  # the same floats as if never saved
    rebuilt = _continue(without)  # rebuilt from the run: another certified bracket
    assert all(abs(a - b) <= 1e-3 * b for a, b in zip(rebuilt, expected, strict=True))


def test_characteristic_of_another_history_is_ignored() -> None:
    state = _trained(300).state_dict()
    other = _trained(300)
    state_other = other.state_dict()
    trace = trace_as_lists(state_other["optimizer_trace"])
    trace["lr"]["values"] = [lr * 1.5 for lr in trace["lr"]["values"]]
    state_other["optimizer_trace"] = trace
    state_other["weighted_characteristic"] = state["weighted_characteristic"]
    edited = LastIterateAccountant()
    edited.load_state_dict(state_other)
    reference = LastIterateAccountant()
    reference.load_state_dict({k: v for k, v in state_other.items() if k != "weighted_characteristic"})
    assert _continue(edited, 3) == _continue(reference, 3)


def test_characteristic_that_is_not_a_mapping_is_rejected_and_nothing_changes() -> None:
    state = _trained(100).state_dict()
    state["weighted_characteristic"] = [1, 2, 3]
    acc = _trained(50)
    before = acc.state_dict()
    with pytest.raises(TypeError, match=r"state_dict\['weighted_characteristic'\]"):
        acc.load_state_dict(state)
    assert acc.state_dict() == before


def test_first_query_after_load_costs_what_the_next_ones_cost() -> None:
    """The engine is restored at the load, not at the first query: that query is no slower
    than a few times the median of the next ones (each the minimum over repeats; rebuilding
    the engine from a 4,000-entry trace costs about 10 of them)."""
    state = _trained(4000, every=100).state_dict()
    runs = []
    for _ in range(REPEATS):
        acc = LastIterateAccountant()
        acc.load_state_dict(state)
        times = []
        for lr in cosine_schedule(0.05, QUERIES):
            acc.replay_step(2.0, 0.045, SGDSettings(float(lr), 0.9, 0.0, False, 0.0))
            t0 = time.perf_counter()
            acc.get_epsilon(1e-5)
            times.append(time.perf_counter() - t0)
        runs.append(times)
    per_query = [min(r[i] for r in runs) for i in range(QUERIES)]
    median = statistics.median(per_query[1:])
    assert per_query[0] <= 5 * median, (
        f"first query after load {per_query[0] * 1e3:.2f} ms, median {median * 1e3:.2f} ms"
    )
