"""Each record's labels say what its numbers are for the run's sampling scheme."""

from __future__ import annotations

import pytest

from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.callbacks.records import LABELS, labels_for, sampling_field


def test_poisson_labels_are_the_plain_ones_without_a_poisson_assumed_field() -> None:
    labels = labels_for("poisson")
    assert "poisson_assumed_epsilon" not in labels
    assert all(labels[k] == LABELS[k] for k in labels)
    assert "upper bound" in labels["standard_epsilon"]


@pytest.mark.parametrize("name", ["shuffled", "deterministic", "balls_in_bins"])
def test_epoch_schemes_name_the_scheme_and_mark_the_poisson_value(name: str) -> None:
    labels = labels_for(name)
    assert all(label.endswith(f"[batches: {name}]") for label in labels.values())
    assert labels["poisson_assumed_epsilon"].startswith("assumes Poisson sampling: not a guarantee")
    assert "assumes Poisson" in labels["corrected_epsilon"]
    expected = "random-allocation" if name == "balls_in_bins" else "without amplification"
    assert expected in labels["standard_epsilon"]


def test_unknown_sampler_assuming_poisson_keeps_poisson_labels_and_says_unknown() -> None:
    scheme = UnknownSampling(sampler_name="WeightedRandomSampler", assumed=PoissonSampling(0.1))
    name = sampling_field(scheme)
    assert name == "unknown (assumes poisson)"
    labels = labels_for(name)
    assert "poisson_assumed_epsilon" not in labels
    assert labels["standard_epsilon"].endswith("[batches: unknown (assumes poisson)]")


def test_sampling_field_names() -> None:
    assert sampling_field(None) == "poisson"
    assert sampling_field(ShuffledBatches(100, 10)) == "shuffled"
    assert sampling_field(BallsInBins(10)) == "balls_in_bins"
