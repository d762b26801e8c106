"""The exact law of a sum of independent discrete weights in the shuffled-batch heuristic
(``sampling_heuristic._exact_sum``), against brute-force enumeration of every outcome."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest

from opacus_lastiterate.analysis import sampling_heuristic


def _brute_force(options):
    laws = []
    for values, probs in options:
        law = list(zip(values.tolist(), probs.tolist(), strict=True))
        law.append((0.0, max(0.0, 1.0 - float(probs.sum()))))
        laws.append(law)
    out: dict[float, float] = defaultdict(float)
    for outcome in itertools.product(*laws):
        out[math.fsum(v for v, _ in outcome)] += math.prod(p for _, p in outcome)
    return {v: p for v, p in out.items() if p > 0}


@pytest.mark.parametrize("seed", range(12))
def test_exact_sum_is_the_law_of_the_sum(seed):
    rng = np.random.default_rng(seed)
    options = []
    for _ in range(int(rng.integers(1, 6))):
        k = int(rng.integers(1, 4))
        values = rng.integers(1, 5, size=k) / 4.0  # exact sums: collisions are exact
        probs = rng.random(k)
        probs *= float(rng.choice([1.0, 0.6])) / probs.sum()
        options.append((values, probs))
    got = sampling_heuristic._exact_sum(options)
    want = _brute_force(options)
    assert got is not None
    got = {v: p for v, p in got.items() if p > 0}
    assert sorted(got) == sorted(want)
    for v, p in want.items():
        assert got[v] == pytest.approx(p, rel=1e-12, abs=1e-15)
    assert math.fsum(got.values()) == pytest.approx(1.0, abs=1e-12)


def test_exact_sum_gives_up_beyond_the_support_limit(monkeypatch):
    monkeypatch.setattr(sampling_heuristic, "EXACT_SUPPORT_LIMIT", 10)
    options = [(np.array([2.0**-i]), np.array([0.5])) for i in range(5)]  # 32 distinct sums
    assert sampling_heuristic._exact_sum(options) is None
    assert sampling_heuristic._exact_sum(options[:3]) is not None  # 8 sums
