"""Count distributions against mpmath (independent, 40 digits) and brute force."""

from __future__ import annotations

import itertools
import math

import mpmath as mp
import numpy as np
import pytest

from opacus_lastiterate.analysis.last_iterate.canary_count import (
    BinomialSequence,
    binomial_count,
    binomial_count_stack,
    poisson_binomial_count,
)


@pytest.mark.parametrize("n,q", [(1, 1e-4), (10, 0.5), (1000, 0.01), (100_000, 1e-3), (1_000_000, 1e-2), (5000, 0.999)])
def test_binomial_log_pmf_against_mpmath(n, q):
    c = binomial_count(n, q)
    mp.mp.dps = 40
    idx = np.unique(np.linspace(0, c.log_pmf.size - 1, 9).astype(int))
    for i in idx:
        k = int(c.support[i])
        exact = mp.log(mp.binomial(n, k)) + k * mp.log(q) + (n - k) * mp.log(1 - mp.mpf(q))
        assert abs(float(c.log_pmf[i] - exact)) < 1e-10
    # The kept mass plus the reported dropped mass is one; the dropped mass is tiny.
    assert math.fsum(np.exp(c.log_pmf)) + c.dropped_mass == pytest.approx(1.0, abs=1e-12)
    assert c.dropped_mass < 1e-30


def test_full_sampling_is_a_point_mass():
    c = binomial_count(7, 1.0)
    assert list(c.support) == [7] and c.log_pmf[0] == 0.0 and c.dropped_mass == 0.0


def test_poisson_binomial_against_enumeration():
    parts = [(2, 0.3), (1, 0.05), (3, 0.5)]
    qs = [q for n, q in parts for _ in range(n)]
    pmf = np.zeros(len(qs) + 1)
    for pattern in itertools.product([0, 1], repeat=len(qs)):
        pmf[sum(pattern)] += math.prod(q if b else 1 - q for b, q in zip(pattern, qs))
    c = poisson_binomial_count(parts)
    got = np.zeros(len(qs) + 1)
    got[c.support] = np.exp(c.log_pmf)
    np.testing.assert_allclose(got, pmf, rtol=1e-12, atol=0)


def test_parts_must_be_pairs():
    with pytest.raises(ValueError, match="parts"):
        poisson_binomial_count([(1, 0.1, 5), (2, 0.2, 5)])  # triples, not pairs
    assert poisson_binomial_count([]).log_pmf.tolist() == [0.0]  # no steps: K = 0


def test_a_rate_schedule_against_mpmath():
    """One-step parts at a new rate each (a rate schedule: Bernoulli blocks convolved in
    pairs), with a binomial and a certain part among them: every kept point within 1e-12
    relative of the 40-digit law, tails included (all terms positive)."""
    qs = [0.01 * (1 + t / 150) for t in range(203)]  # not a multiple of the block size
    parts = [(1, q) for q in qs[:100]] + [(7, 0.2), (1, 1.0)] + [(1, q) for q in qs[100:]]
    mp.mp.dps = 40
    exact = [mp.mpf(1)]
    for n, q in parts:
        for _ in range(n):
            q_mp = mp.mpf(q)
            exact = [a * (1 - q_mp) + b * q_mp for a, b in zip(exact + [0], [0] + exact)]
    c = poisson_binomial_count(parts)
    assert c.dropped_mass < 1e-30
    normal = c.log_pmf > math.log(1e-300)
    assert normal.sum() > 150  # the tails down to 1e-300 are checked
    for k, log_p in zip(c.support[normal], c.log_pmf[normal]):
        assert abs(float(mp.log(exact[int(k)])) - log_p) < 1e-12 * max(1.0, abs(log_p))
    assert c.support[0] == 1 and math.fsum(np.exp(c.log_pmf)) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    "start,count,q", [(2, 400, 0.5), (2, 3000, 1e-3), (999_000, 300, 0.01), (50, 200, 0.97)]
)
def test_binomial_sequence_against_mpmath_without_rebuilds(start, count, q):
    """The ratio update alone, over hundreds of steps (windows growing at both ends), stays
    within 1e-12 of 40-digit values; window and dropped mass are binomial_count's."""
    seq = BinomialSequence(q, rebuild_every=10**9)
    for n in range(start, start + count):
        c = seq.count(n)
        ref = binomial_count(n, q)
        assert (c.offset, c.log_pmf.size, c.dropped_mass) == (
            ref.offset,
            ref.log_pmf.size,
            ref.dropped_mass,
        )
    mp.mp.dps = 40
    for i in np.unique(np.linspace(0, c.log_pmf.size - 1, 7).astype(int)):
        k = c.offset + int(i)
        exact = mp.log(mp.binomial(n, k)) + k * mp.log(q) + (n - k) * mp.log(1 - mp.mpf(q))
        assert abs(c.log_pmf[i] - float(exact)) <= 1e-12


def test_binomial_sequence_rebuilds_when_steps_do_not_follow_on():
    seq = BinomialSequence(0.1)
    seq.count(100)
    jumped = seq.count(250)  # not 101: computed afresh
    ref = binomial_count(250, 0.1)
    assert jumped.offset == ref.offset
    np.testing.assert_array_equal(jumped.log_pmf, ref.log_pmf)


@pytest.mark.parametrize("q", [1e-3, 0.045, 0.5, 0.97])
@pytest.mark.parametrize("start", [1, 700])
def test_count_stack_rows_are_the_single_counts(q, start):
    """Each row of the stack has the window and dropped mass of ``binomial_count`` exactly
    and its log-pmf to rounding (the recursion is the same; only the normalising sum may
    group its terms differently)."""
    steps = np.arange(start, start + 120)
    offset, log_pmf, dropped = binomial_count_stack(steps, q)
    for row, n, m in zip(log_pmf, steps, dropped, strict=True):
        single = binomial_count(int(n), q)
        kept = np.flatnonzero(np.isfinite(row))
        assert offset + kept[0] == single.offset and kept.size == single.log_pmf.size
        assert kept[-1] - kept[0] + 1 == kept.size  # one contiguous window
        assert m == single.dropped_mass
        np.testing.assert_allclose(row[kept], single.log_pmf, rtol=0, atol=1e-13)
