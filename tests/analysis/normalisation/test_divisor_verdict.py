"""FEASGM verdicts for concrete Opacus 1.x configurations, and the public-divisor fix."""

from __future__ import annotations

import dataclasses

import pytest

from opacus_lastiterate.analysis.normalisation import DivisorVerdict, unsafe_dataset_sizes
from opacus_lastiterate.analysis.normalisation.divisor_verdict import (
    feasgm_verdict,
)
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic


def test_mnist_batch_256_is_safe() -> None:
    v = feasgm_verdict(60000, 256)
    assert v.verdict == "safe" and v.safe
    assert v.divisors == (255.0, 255.0, 255.0)
    assert v.sample_rates == (1 / 235,) * 3
    assert v.dataset_sizes == (59999, 60000, 60001)
    assert "SGM guarantee holds exactly" in v.reason


@pytest.mark.parametrize(
    ("n", "batch_size", "divisors", "what"),
    [
        # N a multiple of L: the neighbour N - 1 has divisor L - 1
        (50000, 250, (249.0, 250.0, 248.0), "divisor"),
        (60000, 100, (99.0, 100.0, 99.0), "divisor"),
        (60160, 256, (255.0, 256.0, 254.0), "divisor"),  # 60160 = 235 * 256
        # N = k L + 1: len(DataLoader) changes, and with it q and the steps per epoch
        (60161, 256, (256.0, 254.0, 254.0), "sampling rate"),
        (147, 3, (2.0, 2.0, 2.0), "sampling rate"),  # float artefact: c = 2, not 3
        (49, 1, (1.0, 0.0, 1.0), "is 0"),  # the NaN model
    ],
)
def test_unsafe_configurations(n: int, batch_size: int, divisors: tuple, what: str) -> None:
    v = feasgm_verdict(n, batch_size)
    assert v.verdict == "unsafe" and not v.safe
    assert v.divisors == divisors
    assert what in v.reason and "epsilon = inf" in v.reason


def test_verdict_matches_direct_arithmetic() -> None:
    """The verdict is unsafe exactly when (c, q) differ between neighbours (or c = 0)."""
    for n in range(2, 3000):
        rows = [opacus1x_batch_arithmetic(m, 32) for m in (n - 1, n, n + 1)]
        keys = {(r.expected_batch_size, r.sampler_rate) for r in rows}
        unsafe = len(keys) > 1 or rows[1].expected_batch_size == 0
        assert feasgm_verdict(n, 32).safe is not unsafe, n


def test_unsafe_dataset_sizes_agree_with_verdicts() -> None:
    sizes = unsafe_dataset_sizes(256, start=59000, stop=61000)
    for n in range(59000, 61000):
        assert (n in sizes) is (not feasgm_verdict(n, 256).safe)
    assert 60000 not in sizes and {60159, 60160, 60161} <= set(sizes)


def test_verdict_is_frozen() -> None:
    v = feasgm_verdict(60000, 256)
    assert isinstance(v, DivisorVerdict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.verdict = "unsafe"  # type: ignore[misc]


def test_accountant_rate_note_in_safe_reason() -> None:
    # k = 93 gives len(DPDataLoader) = 92: find a safe N with it
    safe = [n for n in range(9211, 9300) if feasgm_verdict(n, 100).safe]
    assert safe
    assert "conservative" in feasgm_verdict(safe[0], 100).reason


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: feasgm_verdict(1, 10), ValueError, "dataset_size"),
        (lambda: feasgm_verdict(100, 0), ValueError, "batch_size"),
        (lambda: feasgm_verdict(10, 10, drop_last=True), ValueError, "drop_last"),
        (lambda: feasgm_verdict(100.0, 10), TypeError, "dataset_size"),
        (lambda: unsafe_dataset_sizes(10, start=5, stop=4), ValueError, "stop"),
    ],
)
def test_validation(call, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call()
