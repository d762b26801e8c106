"""Sampling schemes: validated, immutable, JSON round trip, checked against the run's rates."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import (
    SAMPLING_NAMES,
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
    check_sampling_matches,
    effective_sampling,
    sampling_from_dict,
)

SCHEMES = [
    PoissonSampling(0.1),
    ShuffledBatches(1000, 300),
    ShuffledBatches(1000, 300, drop_last=True),
    DeterministicBatches(10, 3, drop_last=False),
    BallsInBins(7),
    UnknownSampling("WeightedRandomSampler", ShuffledBatches(100, 10)),
]


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.name)
def test_json_round_trip_and_name(scheme: object) -> None:
    data = scheme.as_dict()  # type: ignore[attr-defined]
    assert data["name"] in SAMPLING_NAMES and data["name"] == scheme.name  # type: ignore[attr-defined]
    back = sampling_from_dict(json.loads(json.dumps(data)))
    assert back == scheme
    assert isinstance(scheme.describe(), str) and scheme.describe()  # type: ignore[attr-defined]
    first = dataclasses.fields(scheme)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(scheme, first, 2)


def test_names_are_the_documented_literals() -> None:
    assert [type(s).name for s in SCHEMES] == [  # type: ignore[attr-defined]
        "poisson", "shuffled", "shuffled", "deterministic", "balls_in_bins", "unknown",
    ]


def test_fixed_size_arithmetic_matches_a_dataloader_by_hand() -> None:
    # N = 1000, B = 300: batches 300, 300, 300, 100 (kept) or 300, 300, 300 (dropped)
    kept, dropped = ShuffledBatches(1000, 300), ShuffledBatches(1000, 300, drop_last=True)
    assert kept.steps_per_epoch == 4 and kept.batch_sizes == (300, 300, 300, 100)
    assert dropped.steps_per_epoch == 3 and dropped.batch_sizes == (300, 300, 300)
    assert kept.step_probabilities().sum() == pytest.approx(1.0)
    assert dropped.step_probabilities().sum() == pytest.approx(0.9)  # 100 of 1000 dropped
    assert kept.sample_rate == 0.3
    assert PoissonSampling(0.2).steps_per_epoch is None
    assert BallsInBins(4).step_probabilities().tolist() == [0.25] * 4


def test_unknown_delegates_to_its_assumption() -> None:
    u = UnknownSampling("MySampler", BallsInBins(5))
    assert u.steps_per_epoch == 5 and u.sample_rate == 0.2
    assert "MySampler" in u.describe() and "balls-in-bins" in u.describe()
    assert "not a guarantee" in u.describe()
    assert effective_sampling(u) == BallsInBins(5)
    assert effective_sampling(None) is None


@pytest.mark.parametrize(
    "build,error,fragment",
    [
        (lambda: PoissonSampling(0.0), ValueError, "`rate` must be in (0, 1]"),
        (lambda: PoissonSampling("0.1"), TypeError, "`rate`"),
        (lambda: ShuffledBatches(0, 1), ValueError, "`dataset_size` must be an integer >= 1"),
        (lambda: ShuffledBatches(10, 11), ValueError, "`batch_size` must be an integer in [1, dataset_size = 10]"),
        (lambda: ShuffledBatches(10, 2.0), TypeError, "`batch_size`"),
        (lambda: ShuffledBatches(10, 2, drop_last=1), TypeError, "`drop_last` must be a bool"),
        (lambda: DeterministicBatches(10, 3, first_step_in_epoch=4), ValueError, "`first_step_in_epoch` must be an integer in [0, 3]"),
        (lambda: BallsInBins(0), ValueError, "`steps_per_epoch` must be an integer >= 1"),
        (lambda: UnknownSampling("", BallsInBins(2)), TypeError, "`sampler_name`"),
        (lambda: UnknownSampling("x", UnknownSampling("y", BallsInBins(2))), TypeError, "`assumed`"),
        (lambda: sampling_from_dict({"name": "random"}), ValueError, "`data['name']` must be one of"),
        (lambda: sampling_from_dict({"name": "shuffled", "dataset_size": 10, "batch_size": 3, "steps_per_epoch": 3}), ValueError, "`data['steps_per_epoch']` must be 4"),
    ],
)
def test_bad_input_names_the_parameter_and_range(build: object, error: type, fragment: str) -> None:
    with pytest.raises(error) as info:
        build()  # type: ignore[operator]
    assert fragment in str(info.value)


def test_advanced_moves_the_epoch_phase() -> None:
    assert BallsInBins(10).advanced(13) == BallsInBins(10, first_step_in_epoch=3)
    assert ShuffledBatches(10, 3, first_step_in_epoch=2).advanced(3) == ShuffledBatches(
        10, 3, first_step_in_epoch=1
    )


# -- the run boundary ------------------------------------------------------------------------


def test_none_keeps_the_run_as_before() -> None:
    run = DPSGDRun.constant(steps=3, sample_rate=0.1, noise_multiplier=1.0)
    assert run.sampling is None
    assert DPSGDRun.from_history([(1.0, 0.1, 3)]).sampling is None


def test_shuffled_accepts_opacus_rate_and_implied_rate() -> None:
    scheme = ShuffledBatches(1000, 300)  # B / N = 0.3, Opacus records 1 / 4 = 0.25
    for q in (0.25, 0.3, 0.27):
        run = DPSGDRun.from_history([(1.0, q, 5)], sampling=scheme)
        assert run.sampling == scheme
    for q in (0.2, 0.31):
        with pytest.raises(ValueError, match="between B / N = 0.3 and Opacus's 1 / len"):
            DPSGDRun.from_history([(1.0, q, 5)], sampling=scheme)


def test_rate_checks_per_scheme() -> None:
    DPSGDRun.constant(steps=2, sample_rate=0.1, noise_multiplier=1.0, sampling=PoissonSampling(0.1))
    with pytest.raises(ValueError, match=r"history\[1\].sample_rate = 0.2"):
        DPSGDRun.from_history([(1.0, 0.1, 2), (1.0, 0.2, 2)], sampling=PoissonSampling(0.1))
    DPSGDRun.constant(steps=2, sample_rate=1 / 7, noise_multiplier=1.0, sampling=BallsInBins(7))
    with pytest.raises(ValueError, match="1 / steps_per_epoch"):
        DPSGDRun.constant(steps=2, sample_rate=0.1, noise_multiplier=1.0, sampling=BallsInBins(7))
    # unknown: checked as its assumption
    with pytest.raises(ValueError, match="does not match"):
        DPSGDRun.constant(
            steps=2, sample_rate=0.5, noise_multiplier=1.0,
            sampling=UnknownSampling("W", PoissonSampling(0.1)),
        )
    # float arithmetic slack only
    DPSGDRun.constant(steps=2, sample_rate=0.1 * (1 + 1e-12), noise_multiplier=1.0, sampling=PoissonSampling(0.1))
    with pytest.raises(ValueError):
        check_sampling_matches(PoissonSampling(0.1), [0.1 * (1 + 1e-6)])


def test_sampling_type_is_checked() -> None:
    with pytest.raises(TypeError, match="`sampling` must be None or one of"):
        DPSGDRun.from_history([(1.0, 0.1, 2)], sampling="poisson")  # type: ignore[arg-type]


def test_suffix_moves_the_phase_and_keeps_poisson() -> None:
    run = DPSGDRun.from_history([(1.0, 0.25, 10)], sampling=ShuffledBatches(1000, 300))
    tail = run.suffix(3)  # starts at step 7 = epoch 1, position 3
    assert tail.sampling == ShuffledBatches(1000, 300, first_step_in_epoch=3)
    u = DPSGDRun.from_history([(1.0, 0.2, 7)], sampling=UnknownSampling("S", BallsInBins(5)))
    assert u.suffix(4).sampling == UnknownSampling("S", BallsInBins(5, first_step_in_epoch=3))
    p = DPSGDRun.constant(steps=5, sample_rate=0.1, noise_multiplier=1.0)
    assert p.suffix(2).sampling is None
    assert math.isclose(np.sum(ShuffledBatches(10, 4).step_probabilities()), 1.0)
