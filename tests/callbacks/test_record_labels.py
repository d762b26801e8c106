"""Each record's labels say what its numbers are for the run's sampling scheme and, for an
adaptive optimizer, that the heuristic treats the second moment as fixed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.callbacks import JsonlSink, LoggingSink
from opacus_lastiterate.callbacks.records import (
    FIELDS,
    LABELS,
    EpsilonRecord,
    labels_for,
    sampling_field,
)


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


def _record(**changes: object) -> EpsilonRecord:
    values: dict[str, object] = {f: None for f in FIELDS}
    values.update(step=3, delta=1e-5, opacus_rdp_epsilon=1.0, noise_multiplier=1.0,
                  sample_rate=0.1, final=False, sampling="poisson", privacy_unit="record")
    values.update(changes)
    return EpsilonRecord(**values)  # type: ignore[arg-type]


def test_an_adaptive_optimizer_labels_the_heuristic_as_such() -> None:
    labels = labels_for("poisson", "adamw")
    assert ADAPTIVE_HEURISTIC_LABEL in labels["heuristic_epsilon"]
    assert "adamw" in labels["heuristic_epsilon"]
    assert "not a DP guarantee" in labels["heuristic_epsilon"]
    # the robust value is the constant-rate formula's: said so, not the adaptive label
    assert ADAPTIVE_HEURISTIC_LABEL not in labels["robust_heuristic_epsilon"]
    assert "constant-rate formula" in labels["robust_heuristic_epsilon"]
    assert labels["standard_epsilon"] == LABELS["standard_epsilon"]
    # SGD runs keep the plain label; the scheme's suffix still applies to an adaptive run
    assert ADAPTIVE_HEURISTIC_LABEL not in labels_for("poisson")["heuristic_epsilon"]
    shuffled = labels_for("shuffled", "adam")["heuristic_epsilon"]
    assert ADAPTIVE_HEURISTIC_LABEL in shuffled and shuffled.endswith("[batches: shuffled]")
    assert _record(optimizer="adamw").labels() == labels


def test_the_optimizer_field_round_trips_and_is_validated() -> None:
    record = _record(optimizer="adamw", heuristic_epsilon=0.5)
    assert EpsilonRecord.from_dict(json.loads(json.dumps(record.as_dict()))) == record
    # every field is required: a record without its optimizer is not read as an SGD record
    without = {k: v for k, v in record.as_dict().items() if k != "optimizer"}
    with pytest.raises(ValueError, match="keys"):
        EpsilonRecord.from_dict(without)
    with pytest.raises(ValueError, match="optimizer"):
        _record(optimizer="lion")
    with pytest.raises(ValueError, match="keys"):
        EpsilonRecord.from_dict({**record.as_dict(), "extra": 1})


def test_sinks_carry_the_label(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record = _record(optimizer="adam", heuristic_epsilon=0.5)
    sink = JsonlSink(tmp_path / "log.jsonl")
    sink(record)
    sink.close()
    row = json.loads((tmp_path / "log.jsonl").read_text())
    assert row["optimizer"] == "adam"
    assert ADAPTIVE_HEURISTIC_LABEL in EpsilonRecord.from_dict(row).labels()["heuristic_epsilon"]
    with caplog.at_level(logging.INFO, logger="opacus_lastiterate.privacy"):
        LoggingSink()(record)
    column = [m for m in caplog.messages if m.startswith("privacy column heuristic_epsilon")]
    assert len(column) == 1 and ADAPTIVE_HEURISTIC_LABEL in column[0]
