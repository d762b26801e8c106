"""The weighted heuristic asked at every step after a long gap has no stall: no query of the
recorded pattern takes more than 20 times the median query (a ratio on the same machine,
each query the minimum of repeats of the whole pattern, so that noise does not decide)."""

from __future__ import annotations

import statistics
import time

from opacus_lastiterate.accountants import LastIterateAccountant
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
