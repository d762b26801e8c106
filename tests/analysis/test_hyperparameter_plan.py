"""plan_batch_sizes: each row's configuration, calibrated sigma and epsilons, checked against
the analysis functions at that configuration."""

from __future__ import annotations

import pytest

from opacus_lastiterate.analysis import full_batch_epsilon, plan_batch_sizes, standard_epsilon
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

DELTA = 1e-5


def test_rows_meet_the_target_at_equal_epochs() -> None:
    n, epochs, target = 10_000, 3.0, 2.0
    rows = plan_batch_sizes(
        target, DELTA, dataset_size=n, batch_sizes=[1000, 250, 100], epochs=epochs,
        value_discretization_interval=1e-3, rtol=1e-3,
    )
    assert [r.batch_size for r in rows] == [1000, 250, 100]
    for r in rows:
        assert r.sample_rate == r.batch_size / n
        assert r.steps == round(epochs * n / r.batch_size) and r.epochs == pytest.approx(epochs)
        kw = {"steps": r.steps, "sample_rate": r.sample_rate, "noise_multiplier": r.noise_multiplier}
        assert r.heuristic == privacy_model("heuristic", DPSGDRun.constant(**kw)).epsilon(DELTA) <= target
        # minimal: 2 rtol less noise misses the target
        smaller = {**kw, "noise_multiplier": r.noise_multiplier / 1.002}
        assert privacy_model("heuristic", DPSGDRun.constant(**smaller)).epsilon(DELTA) > target
        assert r.robust_heuristic == privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(DELTA)
        assert r.standard == standard_epsilon(DELTA, value_discretization_interval=1e-3, **kw)
        assert r.full_batch == full_batch_epsilon(DELTA, **kw)
        assert r.noise_per_example == r.noise_multiplier / r.batch_size
    # the Table 1 effect: equal heuristic, the standard epsilon grows as the batch shrinks
    assert rows[0].standard < rows[1].standard < rows[2].standard


def test_fixed_steps_and_robust_calibration() -> None:
    rows = plan_batch_sizes(
        1.0, DELTA, dataset_size=1000, batch_sizes=[10, 100], steps=50, accountant="robust_heuristic",
        rtol=1e-3,
    )
    assert [r.steps for r in rows] == [50, 50]
    for r in rows:
        assert r.robust_heuristic <= 1.0 and r.heuristic <= r.robust_heuristic


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_sizes": [2000]}, "batch_sizes"),
        ({"batch_sizes": []}, "batch_sizes"),
        ({"batch_sizes": [0]}, "batch_sizes"),
        ({"epochs": None}, "exactly one"),
        ({"steps": 5}, "exactly one"),
        ({"dataset_size": 0}, "dataset_size"),
    ],
)
def test_bad_arguments(kwargs, match) -> None:
    args = {"dataset_size": 1000, "batch_sizes": [10], "epochs": 1.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        plan_batch_sizes(1.0, DELTA, **args)  # type: ignore[arg-type]
